// CUDA launcher for the elementwise kernel of elementwise_kernel.h (which the emulated device
// also runs, on the host): one grid-stride kernel, 16-byte vector loads when both pointers allow
// it. All numerics live in reduce_ops.h.
#include "kernels/cuda_reduce.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/elementwise_kernel.h"

namespace commlib {
namespace {

using namespace gpu;

// `stop` (null: none) is a word of mapped host memory: nonzero when the kernel starts, it writes
// nothing (the copy path's gated operations, device/device.h). One read per block.
template <class F, int kAccess>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(void* dst, const void* src, size_t n, F f,
                                                               const uint64_t* stop) {
  if (stop) {
    __shared__ int skip;
    if (threadIdx.x == 0) skip = *reinterpret_cast<const volatile uint64_t*>(stop) != 0;
    __syncthreads();
    if (skip) return;
  }
  elementwise_body<F, kAccess>(dst, src, n, f);
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": kernel launch failed: " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
}

struct CudaLaunch {
  const char* what;
  void* dst;
  const void* src;
  size_t n;
  cudaStream_t stream;
  const uint64_t* stop = nullptr;
  bool preload = false;  // load the kernel's three variants instead of launching
  template <class F>
  void operator()(F f) {
    if (preload) {
      cudaFuncAttributes attr;
      cudaFuncGetAttributes(&attr, elementwise_kernel<F, kVector>);
      cudaFuncGetAttributes(&attr, elementwise_kernel<F, kElement>);
      cudaFuncGetAttributes(&attr, elementwise_kernel<F, kBytes>);
      return;
    }
    if (n == 0) return;
    const LaunchShape shape = launch_shape<typename F::S>(dst, src, n);
    if (shape.access == kVector)
      elementwise_kernel<F, kVector><<<shape.blocks, kThreads, 0, stream>>>(dst, src, n, f, stop);
    else if (shape.access == kElement)
      elementwise_kernel<F, kElement><<<shape.blocks, kThreads, 0, stream>>>(dst, src, n, f, stop);
    else
      elementwise_kernel<F, kBytes><<<shape.blocks, kThreads, 0, stream>>>(dst, src, n, f, stop);
    check_launch(what);
  }
};

}  // namespace

void cuda_reduce_inplace(void* dst, const void* src, size_t n, DType dtype, RedOp op, cudaStream_t stream,
                         const uint64_t* stop) {
  CudaLaunch launch{"cuda_reduce_inplace", dst, src, n, stream, stop};
  ReduceVisitor<CudaLaunch> v{launch};
  kern::dispatch_reduce(dtype, op, v);
}

void cuda_scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale, cudaStream_t stream) {
  CudaLaunch launch{"cuda_scale_copy", dst, src, n, stream};
  ScaleVisitor<CudaLaunch> v{launch, scale};
  kern::dispatch_dtype(dtype, v);
}

void cuda_divide_inplace(void* dst, size_t n, DType dtype, int64_t divisor, cudaStream_t stream,
                         const uint64_t* stop) {
  kern::check_divisor(divisor);
  CudaLaunch launch{"cuda_divide_inplace", dst, dst, n, stream, stop};
  DivideVisitor<CudaLaunch> v{launch, divisor};
  kern::dispatch_dtype(dtype, v);
}

void cuda_copy_unless(const uint64_t* stop, void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  CudaLaunch launch{"cuda_copy_unless", dst, src, bytes, stream, stop};
  launch(CopyElem{});
}

void cuda_preload_kernels() {
  // With lazy loading (CUDA's default since 12.2) a kernel's first launch loads its module, which
  // synchronises the context: with the engine's streams parked in waits on peers that can hang.
  // Loading them all up front (cudaFuncGetAttributes loads a function) takes that off every call.
  for (int d = 0; d < static_cast<int>(DType::kCount); ++d) {
    const DType dtype = static_cast<DType>(d);
    CudaLaunch launch{"preload", nullptr, nullptr, 0, nullptr, nullptr, true};
    for (int o = 0; o < static_cast<int>(RedOp::kCount); ++o) {
      try {
        ReduceVisitor<CudaLaunch> v{launch};
        kern::dispatch_reduce(dtype, static_cast<RedOp>(o), v);
      } catch (const std::exception&) {  // an op this dtype has not (bitwise on floats)
      }
    }
    ScaleVisitor<CudaLaunch> sv{launch, 1.0};
    kern::dispatch_dtype(dtype, sv);
    DivideVisitor<CudaLaunch> dv{launch, 1};
    kern::dispatch_dtype(dtype, dv);
  }
  CudaLaunch launch{"preload", nullptr, nullptr, 0, nullptr, nullptr, true};
  launch(CopyElem{});
  cudaGetLastError();
}

}  // namespace commlib
