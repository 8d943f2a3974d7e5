// The CUDA launcher of the kernel executor (plan_kernel.cuh): one kernel per element functor and
// plan kind (message or one-sided),
// kCudaThreads threads per block, a grid of at most kMaxBlocks blocks (all co-resident: the wait
// loops need every block of every rank running).
#include "kernels/cuda_plan_kernel.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/plan_kernel.cuh"

namespace commlib {
namespace {

using namespace kexec;

template <class F>
__global__ void __launch_bounds__(kCudaThreads, 1) plan_kernel(PlanLaunch a, F f) {
  run_message_plan(a, f);
}

// One-sided plans as a kernel of their own: one body with both executors spills registers.
template <class F>
__global__ void __launch_bounds__(kCudaThreads, 1) one_sided_kernel(PlanLaunch a, F f) {
  run_one_sided(a, f);
}

struct CudaPlanLaunch {
  const PlanLaunch& a;
  unsigned blocks;
  cudaStream_t stream;
  template <class F>
  void launch(F f) {
    if (a.one_sided)
      one_sided_kernel<F><<<blocks, kCudaThreads, 0, stream>>>(a, f);
    else
      plan_kernel<F><<<blocks, kCudaThreads, 0, stream>>>(a, f);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
      throw std::runtime_error(std::string("kernel path: launch failed: ") + cudaGetErrorName(err) + ": " +
                               cudaGetErrorString(err));
  }
  template <DType D, class Op>
  void reduce() {
    launch(gpu::ReduceElem<D, Op>{});
  }
};

}  // namespace

unsigned cuda_plan_blocks(unsigned wanted) { return std::max(1u, std::min(wanted, kMaxBlocks)); }

namespace {
// The fewest blocks per SM over the executor's variants (each functor is its own kernel).
struct OccupancyProbe {
  int fewest = 1 << 30;
  template <class F>
  void launch(F) {
    for (const void* kernel : {reinterpret_cast<const void*>(plan_kernel<F>), reinterpret_cast<const void*>(one_sided_kernel<F>)}) {
      int n = 0;
      const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kCudaThreads, 0);
      if (err != cudaSuccess)
        throw std::runtime_error(std::string("cudaOccupancyMaxActiveBlocksPerMultiprocessor: ") + cudaGetErrorName(err));
      fewest = std::min(fewest, n);
    }
  }
  template <DType D, class Op>
  void reduce() {
    launch(gpu::ReduceElem<D, Op>{});
  }
};
}  // namespace

int cuda_plan_blocks_per_sm() {
  OccupancyProbe probe;
  probe.launch(NoReduce{});
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64})
    kern::dispatch_reduce(d, RedOp::Sum, probe);
  return probe.fewest;
}

void cuda_launch_plan(const PlanLaunch& a, unsigned blocks, DType dtype, RedOp op, bool reduces, cudaStream_t stream) {
  CudaPlanLaunch l{a, blocks, stream};
  if (reduces)
    kern::dispatch_reduce(dtype, op, l);
  else
    l.launch(NoReduce{});
}

}  // namespace commlib
