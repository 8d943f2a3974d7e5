// Test and benchmark entry points for the CPU reduction kernels, on anything that exposes the
// buffer protocol (NumPy arrays; bfloat16 travels as uint16, float16 as float16 or uint16).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings/bindings.h"
#include "common/types.h"
#include "kernels/cpu_copy.h"
#include "kernels/cpu_features.h"
#include "kernels/cpu_reduce.h"

namespace py = pybind11;

namespace commlib {
namespace {

bool is_c_contiguous(const py::buffer_info& info) {
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] == 1) continue;
    if (info.strides[i] != expect) return false;
    expect *= info.shape[i];
  }
  return true;
}

// Validates one buffer against the dtype and returns its element count.
size_t checked_count(const char* name, const py::buffer_info& info, DType dtype) {
  if (info.itemsize != static_cast<py::ssize_t>(dtype_size(dtype)))
    throw py::value_error(std::string(name) + ": item size " + std::to_string(info.itemsize) +
                          " bytes does not match dtype " + dtype_name(dtype) + " (" +
                          std::to_string(dtype_size(dtype)) + " bytes)");
  if (!is_c_contiguous(info)) throw py::value_error(std::string(name) + ": buffer must be contiguous");
  return static_cast<size_t>(info.size);
}

py::buffer_info request(const char* name, const py::buffer& buf, bool writable) {
  try {
    return buf.request(writable);
  } catch (py::error_already_set& e) {
    throw py::value_error(std::string(name) + ": " + (writable ? "writable " : "") +
                          "buffer required (" + e.what() + ")");
  }
}

// dst and src of an element-wise kernel: dst writable, both of dtype's item size, contiguous and
// of the same element count (ValueError naming the buffer otherwise).
struct Operands {
  py::buffer_info dst, src;
  size_t count;
  Operands(const py::buffer& d, const py::buffer& s, DType dtype)
      : dst(request("dst", d, true)), src(request("src", s, false)), count(checked_count("dst", dst, dtype)) {
    const size_t ns = checked_count("src", src, dtype);
    if (count != ns)
      throw py::value_error("src: " + std::to_string(ns) + " elements, but dst has " + std::to_string(count));
  }
};

void reduce_local(const py::buffer& dst, const py::buffer& src, DType dtype, RedOp op) {
  if (op_is_bitwise(op) && !dtype_is_integer(dtype))  // refuse before touching any buffer
    throw py::value_error(std::string("op: bitwise reduction '") + op_name(op) +
                          "' is defined for integer dtypes only, not " + dtype_name(dtype));
  const Operands o(dst, src, dtype);
  py::gil_scoped_release nogil;
  reduce_inplace(o.dst.ptr, o.src.ptr, o.count, dtype, op);
}

void scale_copy_py(const py::buffer& dst, const py::buffer& src, DType dtype, double scale) {
  const Operands o(dst, src, dtype);
  py::gil_scoped_release nogil;
  scale_copy(o.dst.ptr, o.src.ptr, o.count, dtype, scale);
}

void divide_local(const py::buffer& dst, DType dtype, int64_t divisor) {
  if (divisor <= 0) throw py::value_error("divisor: must be positive, got " + std::to_string(divisor));
  py::buffer_info d = request("dst", dst, true);
  const size_t nd = checked_count("dst", d, dtype);
  py::gil_scoped_release nogil;
  divide_inplace(d.ptr, nd, dtype, divisor);
}

void copy_local(const py::buffer& dst, const py::buffer& src, bool stream) {
  py::buffer_info d = request("dst", dst, true);
  py::buffer_info s = request("src", src, false);
  const size_t nd = static_cast<size_t>(d.size * d.itemsize), ns = static_cast<size_t>(s.size * s.itemsize);
  if (nd != ns) throw py::value_error("src: " + std::to_string(ns) + " bytes, but dst has " + std::to_string(nd));
  py::gil_scoped_release nogil;
  copy_bytes(d.ptr, s.ptr, nd, stream);
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("reduce_local", &reduce_local, py::arg("dst"), py::arg("src"), py::arg("dtype"), py::arg("op"),
        "dst[i] = dst[i] (op) src[i] with the CPU reduction kernel (avg and premul_sum reduce as sum).");
  m.def("scale_copy", &scale_copy_py, py::arg("dst"), py::arg("src"), py::arg("dtype"), py::arg("scale"),
        "dst[i] = src[i] * scale (premul_sum pre-scaling).");
  m.def("divide_local", &divide_local, py::arg("dst"), py::arg("dtype"), py::arg("divisor"),
        "dst[i] = dst[i] / divisor (avg; integers truncate toward zero).");
  m.def("copy_local", &copy_local, py::arg("dst"), py::arg("src"), py::arg("stream"),
        "Copy src's bytes into dst (the executor's bulk copy; stream=True: non-temporal stores).");
  m.def("cpu_features", []() { return std::string(cpu_reduce_path()); },
        "The CPU reduction kernels' vector path: 'avx512', 'avx2' or 'baseline'.");
  m.def("_cpu_paths", &cpu_reduce_paths_supported, "Vector paths this CPU can run, best first.");
  m.def("_set_cpu_path", &set_cpu_reduce_path, py::arg("path"),
        "Switch the CPU kernels' vector path (tests); returns the previous one.");
}

}  // namespace commlib
