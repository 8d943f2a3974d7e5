// COMMLIB_DEVICE_TRACE (issue #38, item 6): per-block, per-step timestamps of a one-sided launch
// and of a message plan (since session 17: with float16 on the GPU's cvt instructions its kernel has room),
// written by the kernel into a device buffer the host reads after the call (KernelPath::trace,
// stream/kernel_path_trace.cc). Off (PlanLaunch::trace null) nothing is stored: the one test per
// stamp is a compare of a launch parameter, and the emulated device counts every store
// (kEmuTraceStores), which a test pins at 0 with the setting off.
//
// Block b's row (b < kMaxGrid, kTraceRowWords words): [0] the launch's start on that block,
// [1] the row's header, (gridDim.x << 32) | the steps stamped, [2 + k] the end of step k (k <
// kTraceSteps; later steps are not stamped). The header says 0 steps when the block starts and the
// count once its steps are all done, so a block a launch abandoned (the abort word) shows no steps
// rather than an older launch's. Stamps are %globaltimer (nanoseconds, one clock for the device;
// on the emulated device the host's monotonic clock, shared by every rank of the host).
//
// What a step's interval covers: from the end of the previous step (the launch's start for step 0,
// so the descriptor check and a staged copy-in count in step 0) to the block's end of the step,
// its waits included: after the block's own last item of the step.
#pragma once

#include <cstdint>

#include "kernels/plan_launch.cuh"

namespace commlib {
namespace kexec {

constexpr uint32_t kTraceSteps = 1022;
constexpr uint32_t kTraceRowWords = kTraceSteps + 2;

__device__ __forceinline__ uint64_t* trace_row(const PlanLaunch& a) {
  return a.trace + static_cast<size_t>(blockIdx.x) * kTraceRowWords;
}

__device__ __forceinline__ bool traces(const PlanLaunch& a) {
  return a.trace && threadIdx.x == 0 && blockIdx.x < kMaxGrid;
}

// The block's start: its start stamp, and a header of no steps yet.
__device__ __forceinline__ void trace_begin(const PlanLaunch& a) {
  if (!traces(a)) return;
  uint64_t* row = trace_row(a);
  row[0] = global_timer_ns();
  row[1] = static_cast<uint64_t>(gridDim.x) << 32;
  emu_count(kEmuTraceStores, 2);
}

// The end of step k on this block.
__device__ __forceinline__ void trace_step(const PlanLaunch& a, uint32_t k) {
  if (!traces(a) || k >= kTraceSteps) return;
  trace_row(a)[2 + k] = global_timer_ns();
  emu_count(kEmuTraceStores, 1);
}

// Every step of the launch done on this block: the header counts its stamps.
__device__ __forceinline__ void trace_end(const PlanLaunch& a) {
  if (!traces(a)) return;
  const uint32_t n = a.nsteps < kTraceSteps ? a.nsteps : kTraceSteps;
  trace_row(a)[1] = (static_cast<uint64_t>(gridDim.x) << 32) | n;
  emu_count(kEmuTraceStores, 1);
}

}  // namespace kexec
}  // namespace commlib
