// The emulated device's kernels: the CUDA elementwise kernel body (kernels/elementwise_kernel.h)
// executed on the host through kernels/cuda_shim.h, with the grid the CUDA launcher would use.
#include "device/emulated/emulated_device.h"
#include "kernels/elementwise_kernel.h"

namespace commlib {

thread_local EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

using namespace gpu;

// Builds the launch for functor F; dispatching happens when the operation is enqueued (so bad
// arguments throw to the caller), the launch itself when the stream reaches it.
struct EmuLaunch {
  void* dst;
  const void* src;
  size_t n;
  std::function<void()> out;
  template <class F>
  void operator()(F f) {
    if (n == 0) {
      out = [] {};
      return;
    }
    const LaunchShape shape = launch_shape<typename F::S>(dst, src, n);
    void* d = dst;
    const void* s = src;
    const size_t count = n;
    out = [shape, d, s, count, f] {
      if (shape.access == kVector)
        emu_launch(shape.blocks, kThreads, [&] { elementwise_body<F, kVector>(d, s, count, f); });
      else if (shape.access == kElement)
        emu_launch(shape.blocks, kThreads, [&] { elementwise_body<F, kElement>(d, s, count, f); });
      else
        emu_launch(shape.blocks, kThreads, [&] { elementwise_body<F, kBytes>(d, s, count, f); });
    };
  }
};

}  // namespace

std::function<void()> emulated_reduce_kernel(void* dst, const void* src, size_t n, DType dtype, RedOp op) {
  EmuLaunch launch{dst, src, n, {}};
  ReduceVisitor<EmuLaunch> v{launch};
  kern::dispatch_reduce(dtype, op, v);
  return std::move(launch.out);
}

std::function<void()> emulated_scale_kernel(void* dst, const void* src, size_t n, DType dtype, double scale) {
  EmuLaunch launch{dst, src, n, {}};
  ScaleVisitor<EmuLaunch> v{launch, scale};
  kern::dispatch_dtype(dtype, v);
  return std::move(launch.out);
}

std::function<void()> emulated_divide_kernel(void* dst, size_t n, DType dtype, int64_t divisor) {
  kern::check_divisor(divisor);
  EmuLaunch launch{dst, dst, n, {}};
  DivideVisitor<EmuLaunch> v{launch, divisor};
  kern::dispatch_dtype(dtype, v);
  return std::move(launch.out);
}

}  // namespace commlib
