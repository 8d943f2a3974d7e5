// The kernel executor's launch parameters and the pieces both executors (message plans:
// plan_kernel.cuh; one-sided plans: plan_one_sided.cuh) share: the block-wide wait, a block's share
// of an item, and the grid barrier (the end of a launch: plan_done.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device_plan_types.h"
#include "kernels/plan_atomics.cuh"
#include "kernels/plan_done.cuh"

namespace commlib {
namespace kexec {

constexpr unsigned kMaxBlocks = 16;  // progress words the host page holds; message plans' grid at most
// One-sided plans' grid at most (the one-sided flags' blocks per (peer, tag), PlanLaunch::os_blocks,
// and the trace's rows): the grid itself is the device's SM count or the rank's share of its
// resident blocks, whichever is less, and what the message needs (KernelPath::plan_one_sided).
// Blocks from kMaxBlocks on write no progress word (the watchdog sums the first kMaxBlocks').
constexpr unsigned kMaxGrid = 256;
constexpr unsigned kCudaThreads = 512;
constexpr uint32_t kAbortPollEvery = 16;  // spins between reads of the (host-memory) abort word
// The per-call counters' words (PlanLaunch::barrier, kCounter*) and the launch's end: plan_done.cuh.

// What this rank reaches of peer p (addresses valid in this process; its own entry unused).
struct PeerView {
  char* slots;      // p's slots[.][.]
  uint64_t* ready;  // p's ready[.][.]
  uint64_t* freed;  // p's freed[.][.]
  uint64_t* ll;     // p's LL slots: ll[q][s], ll_lines words each
  uint64_t* descs;  // p's call-descriptor ring (plan_call_check.cuh)
  uint64_t* os_flags;  // p's one-sided signal flags: [sender][kSignalTags + 1][os_blocks] (plan_one_sided.cuh)
};

// The kernel's parameters (passed by value).
struct PlanLaunch {
  const kplan::PlanItem* items;
  const kplan::PlanStep* steps;
  const uint32_t* sends_to;    // the plan's chunks per peer
  const uint32_t* recvs_from;
  const PeerView* peers;       // [size]
  char* bases[3];              // input, output, scratch of the call
  char* slots;                 // this rank's kernel region
  uint64_t* ready;
  uint64_t* freed;
  uint64_t* ll;                // this rank's LL slots
  char* ll_stage;              // this rank only: [gridDim.x][ll_bytes], one stage per block
  uint64_t* sent;              // [size] chunks sent to each peer before this call (device)
  uint64_t* received;          // [size]
  // This rank's per-call counters, on the device and advanced by the kernel alone, so that a launch
  // captured in a CUDA graph replays right any number of times between eager launches: [0] the
  // grid barrier's arrivals, [1] their count when the next launch starts (the barrier's
  // generation), [2] launches run (eager and replayed), [3] eager launches run, [4] replayed
  // (captured) launches run, [5] blocks of the running launch that exited (end_launch; kCounter*).
  uint64_t* barrier;
  const uint64_t* abort;       // host memory mapped for the device: nonzero = stop
  uint64_t* progress;          // host memory mapped: [kMaxBlocks] items done per block
  uint64_t* done;              // host memory mapped: an eager launch's last block to exit stores its number (counter [3])
  uint64_t* replays_done;      // host memory mapped: a captured launch stores its number (counter [4]) at its end
  uint64_t* replays_started;   // host memory mapped: ... and at its start (the watchdog sees a replay running)
  uint64_t* chunk_counts;      // device: [kMaxBlocks][2] message chunks (sent and received) each block
                               // moved by LL and through slots, all launches together (read by the host
                               // after they completed: KernelPath::chunks_moved)
  // The call's descriptor check (plan_call_check.cuh); desc_ring_len 0: none (no peer in the plan).
  uint64_t desc[3];            // this call's CallDesc, as words
  uint64_t* descs;             // this rank's descriptor ring (region): [size][desc_ring_len][kDescWords]
  uint64_t* checked;           // [size] checks made with each peer before this launch (device)
  uint64_t* mismatch;          // host memory mapped: the mismatch record (kMismatchWords)
  uint32_t desc_ring_len;
  uint32_t fold_check;         // the check folded into the data handshakes (one block, every rank a plan peer)
  uint32_t captured;           // launched inside a stream capture (its replays leave `done` alone)
  uint64_t slot_bytes;
  uint32_t nsteps;
  uint32_t nslots;
  uint32_t ll_bytes;           // chunks of at most this many bytes take the LL protocol (0: none)
  uint32_t split_bytes;        // items of at least this many bytes are split over the grid (0: none)
  uint64_t* arrivals;          // [items] the split items' arrival counters (zero between launches)
  uint32_t nitems;
  int rank;
  int size;
  // One-sided plans (plan_one_sided.cuh); one_sided 0: a message plan and none of these is read.
  uint32_t one_sided;
  uint32_t os_blocks;          // the one-sided flags' blocks per (peer, tag): the most a launch has (kMaxGrid)
  const uint64_t* peer_bases;  // [size][3] rank q's input, output, scratch as this process maps them
  uint64_t* os_flags;          // this rank's flags (region): [sender][kSignalTags + 1][os_blocks], peers store
  uint64_t* os_signalled;      // [peer][kSignalTags + 1][os_blocks] signals this rank's block b sent (device)
  uint64_t* os_consumed;       // [peer][kSignalTags + 1][os_blocks] signals it consumed (device)
  char* stage_user[2];         // the staged path: the caller's input and output (null: not staged) ...
  uint64_t stage_bytes[2];     // ... and their bytes; a.bases[0] / [1] are then the staging areas
  uint32_t staged_release;     // staged: one more handshake with every peer at the end (its slots are the staging)
  uint64_t* trace;             // COMMLIB_DEVICE_TRACE: [kMaxGrid][kTraceRowWords] stamps (plan_trace.cuh); null: off
};

// The element functor of collectives that never reduce (their plans have no reduce items).
struct NoReduce {
  using S = uint8_t;
  __device__ __forceinline__ S operator()(S a, S) const { return a; }
};


// Thread 0 waits until *flag >= target or the abort word is set; the whole block learns which.
__device__ __forceinline__ bool block_wait(const uint64_t* flag, uint64_t target, const PlanLaunch& a,
                                                    bool device_scope = false) {
  int stop = 0;
  if (threadIdx.x == 0) {
    uint32_t spins = 0;
    while ((device_scope ? acquire_load_device(flag) : acquire_load(flag)) < target) {
      if (spins % kAbortPollEvery == 0 && abort_poll(a.abort)) {
        stop = 1;
        break;
      }
      pause(spins);
    }
  }
  return !block_any(stop);
}


// This block's share [lo, hi) of an item of n bytes: 64-byte aligned parts (whole elements of
// every dtype, 16-byte accesses where the buffers allow).
__device__ __forceinline__ void share_of(uint64_t n, uint64_t& lo, uint64_t& hi) {
  const uint64_t part = (n + gridDim.x - 1) / gridDim.x;
  const uint64_t aligned = (part + 63) / 64 * 64;
  lo = aligned * blockIdx.x < n ? aligned * blockIdx.x : n;
  hi = lo + aligned < n ? lo + aligned : n;
}

// Every block of the grid has finished step `k` (its writes visible to all blocks) or the abort
// word was set.
// `base`: the arrivals counter's value when the launch started (its generation, read by every block
// before its first arrival, so no block's arrival can have moved it yet). A grid of one block (a
// small call: KernelPath::launch) has no other block to meet: the CTA barrier is the whole of it,
// no arrival, no wait (end_launch's barrier_arrivals counts none).
__device__ __forceinline__ bool grid_barrier(const PlanLaunch& a, uint64_t base, uint32_t k) {
  block_sync();
  if (gridDim.x == 1) return true;
  if (threadIdx.x == 0) arrive(a.barrier + kCounterArrivals);
  emu_count(kEmuGridBarriers, 1);
  return block_wait(a.barrier + kCounterArrivals, base + static_cast<uint64_t>(gridDim.x) * (k + 1), a, true);
}


}  // namespace kexec
}  // namespace commlib
