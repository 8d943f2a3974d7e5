// The kernel executor's completion word (plan_kernel.cuh): how a launch ends, and the per-call
// counters' words it advances. Generic in the launch's parameters (PlanLaunch), as
// plan_call_check.cuh is, so that it stands apart from the executor's body.
#pragma once

#include <cstdint>

#include "kernels/plan_atomics.cuh"

namespace commlib {
namespace kexec {

// The per-call counters' words (PlanLaunch::barrier).
constexpr unsigned kCounterArrivals = 0, kCounterGeneration = 1, kCounterLaunches = 2, kCounterEager = 3,
                   kCounterReplays = 4, kCounterExits = 5;

// The arrivals `barriers` grid barriers add to the arrivals counter: none in a grid of one block,
// whose barriers are its own __syncthreads (grid_barrier, plan_launch.cuh).
__device__ __forceinline__ uint64_t barrier_arrivals(uint32_t barriers) {
  return gridDim.x > 1 ? static_cast<uint64_t>(gridDim.x) * barriers : 0;
}

// The launch's end, run by every block whatever way it left its steps (run_steps, or a one-sided plan's os_steps) (completed, or released by the
// abort word): the LAST block to exit, not block 0, advances the per-call counters and stores the
// launch's number into the host's completion word (`done`, or `replays_done` for a captured
// launch), so that word means what a completion event means: every block of the launch has exited
// and every write it made is visible (docs/gpu.md "The done word").
//
// Why that ordering holds. Each block's threads finish their writes (outputs, the slots' flags,
// block 0's chunk numbers, the chunk counts), then block_sync (a CTA-scope barrier), then its
// thread 0 makes one acq_rel fetch-add at SYSTEM scope on the exit counter (arrive_last). The RMWs
// on one word form a release sequence, so the thread whose add returns gridDim.x - 1 has acquired
// every earlier block's release, and with it (causality is transitive through the CTA barriers and
// the morally strong system-scope RMWs) every write those blocks made. Its release store of the
// number at system scope is cumulative: a host thread that acquire-loads the number, or a stream
// memory operation that waits for it (cuStreamWaitValue64, which reads the word after the GPU's
// store becomes visible at system scope), sees all of them. Block 0 storing the number after the
// last grid barrier (as before) would only know that every block had ARRIVED at that barrier:
// writes after it (the chunk counts, the split counters' reset) and the blocks themselves could
// still be running, which an event never allows. An aborted launch exits the same way, so a host
// or stream waiting for the word is released by the watchdog's abort exactly as by an event; the
// counters it advances then are meaningless, but the engine has failed and launches nothing more.
// The exit counter goes back to 0 (relaxed) in the last block: the next launch of this rank is
// stream-ordered after this one's end (kernel boundary), eager or replayed alike.
// `barriers`: the grid barriers this launch runs when it completes (every block arrives at each), so
// that the next launch's generation is where this one's arrivals end.
template <class L>
__device__ __forceinline__ void end_launch(const L& a, uint64_t base, uint32_t barriers) {
  block_sync();  // every thread of the block is done writing
  if (threadIdx.x != 0 || !arrive_last(a.barrier + kCounterExits, gridDim.x)) return;
  uint64_t* c = a.barrier;
  relaxed_store(c + kCounterExits, 0);
  // Every block has read the generation (it arrived at the last barrier): the next launch's starts
  // where this one's arrivals end. Then the launch numbers, and the host's completion word.
  relaxed_store(c + kCounterGeneration, base + barrier_arrivals(barriers));
  relaxed_store(c + kCounterLaunches, relaxed_load(c + kCounterLaunches) + 1);
  const unsigned mine = a.captured ? kCounterReplays : kCounterEager;  // a replay leaves `done` alone
  const uint64_t n = relaxed_load(c + mine) + 1;
  relaxed_store(c + mine, n);
  host_release_store(a.captured ? a.replays_done : a.done, n);
}

}  // namespace kexec
}  // namespace commlib
