// CUDA entry points of the kernel executor (plan_kernel.cuh; cuda_plan_kernel.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "common/types.h"

namespace commlib {
namespace kexec {
struct PlanLaunch;
}

// Blocks a launch uses for `wanted` parallel items (at least 1, at most kexec::kMaxBlocks).
unsigned cuda_plan_blocks(unsigned wanted);
// cudaOccupancyMaxActiveBlocksPerMultiprocessor of the executor (the fewest over its variants).
int cuda_plan_blocks_per_sm();
// Enqueues the kernel executor on `stream`; a launch error throws std::runtime_error.
void cuda_launch_plan(const kexec::PlanLaunch& launch, unsigned blocks, DType dtype, RedOp op, bool reduces,
                      cudaStream_t stream);

}  // namespace commlib
