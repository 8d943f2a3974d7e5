// commlib._C_cuda: the CUDA reduction kernels on raw device pointers (e.g. torch.cuda tensors'
// data_ptr()), synchronous, for GPU tests and tools. Importing it on a machine without a usable
// CUDA device raises ImportError("commlib._C_cuda: no CUDA device (...)"), never crashes: cudart
// is linked statically and only dlopens the driver.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/device_stream_wrapper.h"
#include "common/types.h"
#include "device/cuda_device.h"
#include "kernels/cuda_reduce.h"


namespace py = pybind11;

namespace commlib {
namespace {

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

// Makes the pointer's device current (tensors on cuda:1 work) and validates it.
void use_device_of(uintptr_t ptr, const char* name) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr));
  if (err != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
    cudaGetLastError();
    throw py::value_error(std::string(name) + ": not a CUDA device pointer");
  }
  check(cudaSetDevice(attr.device), "cudaSetDevice");
}

void synchronize(const char* what) {
  check(cudaGetLastError(), what);
  check(cudaStreamSynchronize(nullptr), what);
}

std::string no_device_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  }
  if (count == 0) return "cudaGetDeviceCount returned 0";
  return "";
}

}  // namespace
}  // namespace commlib

PYBIND11_MODULE(_C_cuda, m) {
  using namespace commlib;
  const std::string reason = no_device_reason();
  if (!reason.empty()) throw py::import_error("commlib._C_cuda: no CUDA device (" + reason + ")");

  m.doc() = "commlib CUDA reduction kernels on device pointers (synchronous; for tests and tools)";


  // The same query for the C++ entry's reader of __cuda_array_interface__ arrays in commlib._C
  // (bindings/foreign_arrays.cc), called there per call without Python in between.
  static int (*const pointer_device_fn)(uintptr_t) = [](uintptr_t ptr) {
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr));
    if (err != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
      cudaGetLastError();
      return -1;
    }
    return attr.device;
  };
  m.attr("pointer_device_fn") =
      py::capsule(reinterpret_cast<void*>(pointer_device_fn), "commlib.pointer_device");
  m.def(
      "pointer_device", [](uintptr_t ptr) { return pointer_device_fn(ptr); }, py::arg("ptr"),
      "The CUDA device of a device pointer (-1: not device memory).");

  m.def("device_count", []() {
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    return count;
  });

  m.def(
      "reduce",
      [](uintptr_t dst_ptr, uintptr_t src_ptr, size_t n, const std::string& dtype, const std::string& op) {
        const DType t = parse_dtype(dtype);
        const RedOp o = parse_op(op);
        if (n == 0) return;
        use_device_of(dst_ptr, "dst_ptr");
        use_device_of(src_ptr, "src_ptr");
        py::gil_scoped_release nogil;
        cuda_reduce_inplace(reinterpret_cast<void*>(dst_ptr), reinterpret_cast<const void*>(src_ptr), n, t, o,
                            nullptr);
        synchronize("reduce");
      },
      py::arg("dst_ptr"), py::arg("src_ptr"), py::arg("n"), py::arg("dtype"), py::arg("op"),
      "dst[i] = dst[i] (op) src[i] for n elements on the device; synchronises.");

  m.def(
      "scale_copy",
      [](uintptr_t dst_ptr, uintptr_t src_ptr, size_t n, const std::string& dtype, double scale) {
        const DType t = parse_dtype(dtype);
        if (n == 0) return;
        use_device_of(dst_ptr, "dst_ptr");
        use_device_of(src_ptr, "src_ptr");
        py::gil_scoped_release nogil;
        cuda_scale_copy(reinterpret_cast<void*>(dst_ptr), reinterpret_cast<const void*>(src_ptr), n, t, scale,
                        nullptr);
        synchronize("scale_copy");
      },
      py::arg("dst_ptr"), py::arg("src_ptr"), py::arg("n"), py::arg("dtype"), py::arg("scale"),
      "dst[i] = src[i] * scale on the device; synchronises.");

  m.def(
      "divide",
      [](uintptr_t dst_ptr, size_t n, const std::string& dtype, int64_t divisor) {
        const DType t = parse_dtype(dtype);
        if (divisor <= 0) throw py::value_error("divisor: must be positive, got " + std::to_string(divisor));
        if (n == 0) return;
        use_device_of(dst_ptr, "dst_ptr");
        py::gil_scoped_release nogil;
        cuda_divide_inplace(reinterpret_cast<void*>(dst_ptr), n, t, divisor, nullptr);
        synchronize("divide");
      },
      py::arg("dst_ptr"), py::arg("n"), py::arg("dtype"), py::arg("divisor"),
      "dst[i] = dst[i] / divisor on the device; synchronises.");

  // Minimal device memory helpers so GPU tests need neither torch nor CuPy.
  m.def(
      "_malloc",
      [](size_t nbytes) {
        void* p = nullptr;
        check(cudaMalloc(&p, nbytes ? nbytes : 1), "cudaMalloc");
        return reinterpret_cast<uintptr_t>(p);
      },
      py::arg("nbytes"));
  m.def(
      "_free", [](uintptr_t ptr) { check(cudaFree(reinterpret_cast<void*>(ptr)), "cudaFree"); }, py::arg("ptr"));
  m.def(
      "_upload",
      [](uintptr_t dst_ptr, const py::buffer& src) {
        py::buffer_info info = src.request();
        check(cudaMemcpy(reinterpret_cast<void*>(dst_ptr), info.ptr, info.size * info.itemsize,
                         cudaMemcpyHostToDevice),
              "cudaMemcpy");
      },
      py::arg("dst_ptr"), py::arg("src"), "Copy a contiguous host buffer to the device.");
  m.def(
      "_download",
      [](const py::buffer& dst, uintptr_t src_ptr) {
        py::buffer_info info = dst.request(true);
        check(cudaMemcpy(info.ptr, reinterpret_cast<const void*>(src_ptr), info.size * info.itemsize,
                         cudaMemcpyDeviceToHost),
              "cudaMemcpy");
      },
      py::arg("dst"), py::arg("src_ptr"), "Copy device memory into a contiguous writable host buffer.");

  // The CUDA device for the stream engine in commlib._C, as capsules holding a
  // std::shared_ptr<Device> / std::shared_ptr<DeviceStream> (commlib._C.device_from_capsule).
  m.def(
      "device_capsule",
      [](int index) {
        auto* holder = new std::shared_ptr<Device>(cuda_device(index));
        return py::capsule(holder, "commlib.Device",
                           [](PyObject* c) { delete static_cast<std::shared_ptr<Device>*>(PyCapsule_GetPointer(c, "commlib.Device")); });
      },
      py::arg("index"), "The CUDA device `index` for the stream engine (a capsule).");
  m.def(
      "stream_capsule",
      [](int index, uintptr_t stream) {
        auto* holder = new std::shared_ptr<DeviceStream>(cuda_device(index)->wrap_stream(stream));
        return py::capsule(holder, "commlib.DeviceStream", [](PyObject* c) {
          delete static_cast<std::shared_ptr<DeviceStream>*>(PyCapsule_GetPointer(c, "commlib.DeviceStream"));
        });
      },
      py::arg("index"), py::arg("stream"), "A caller-owned cudaStream_t (0: the legacy default stream) as a capsule.");
  // The CUDA device as a function commlib._C calls without Python: a C++ caller's first call on a
  // device sets the engine up with it (bindings/device_engines.h, DeviceEngines::set_cuda).
  m.def(
      "device_maker",
      [] {
        std::shared_ptr<Device> (*make)(int) = [](int index) -> std::shared_ptr<Device> { return cuda_device(index); };
        return py::capsule(reinterpret_cast<void*>(make), "commlib.CudaDeviceMaker");
      },
      "cuda_device(index) as a function pointer in a capsule, for commlib._C's engine set-up.");
  // The same wrapping as a function commlib._C calls without Python, for streams the engine has
  // not seen (bindings/device_stream_wrapper.h).
  m.def(
      "stream_wrapper",
      [] {
        CudaStreamWrapper wrap = [](int index, uintptr_t stream) -> std::shared_ptr<DeviceStream> {
          return cuda_device(index)->wrap_stream(stream);
        };
        return py::capsule(reinterpret_cast<void*>(wrap), kCudaStreamWrapperCapsule);
      },
      "CudaDevice::wrap_stream as a function pointer in a capsule, for commlib._C's call cache.");
}
