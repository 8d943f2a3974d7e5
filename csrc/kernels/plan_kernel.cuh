// The kernel executor: one launch per collective interprets this rank's device plan
// (device_plan_types.h). Written once as __host__ __device__ code: the CUDA launcher
// (cuda_plan_kernel.cu) runs it on the GPU, the emulated device (device/emulated/emulated_plan_kernel.cc) on one
// host thread per block, through the shims of cuda_shim.h and plan_atomics.cuh.
//
// Peer memory. Every rank owns a kernel region (stream/kernel_path.h), device memory its peers map
// (IPC): slots[q][s] (nslots inbox slots of slot_bytes per sender q), ready[q][s] (the number + 1
// of the chunk sender q last put into slot s) and freed[p][s] (the number + 1 of the chunk of this
// rank's that receiver p last consumed from its slot s). Chunk c of a pair goes through slot
// c % nslots; chunks are numbered per pair across calls (sent[p], received[q], kept on the device).
//
//   send chunk c to p:      wait freed[p][s] >= c - nslots + 1 (the slot's previous chunk was
//                           consumed); copy into p's slots[me][s]; release-store p's ready[me][s] = c + 1
//   receive chunk c from q: wait ready[q][s] >= c + 1 (acquire); copy or reduce out of slots[q][s];
//                           release-store q's freed[me][s] = c + 1
//
// Memory ordering: a block's threads write a chunk, __syncthreads, then thread 0 stores the flag
// with release semantics at system scope; the reader's thread 0 loads it with acquire semantics,
// then __syncthreads, then its threads read. Release/acquire at system scope plus the barriers
// make every write of the chunk happen-before every read of it (causality is transitive through
// the CTA barrier and the system-scope pair), across processes and GPUs; the same chain, in the
// other direction through freed, keeps a slot from being overwritten while it is still read.
// Per slot the flags only grow: chunk c + nslots can only be sent once chunk c was consumed.
//
// Parallelism and deadlock freedom. Item j of a step runs on block j % gridDim.x, except *split*
// items (at least split_bytes: large chunks), which every block runs a 1/gridDim.x share of; each
// block runs its items in plan order, then all blocks meet in a grid barrier before the next step
// (a step reads what the previous one received). Give every item the rank (step,
// chunk-within-step, send before receive): a send waits only for a receive of a lower rank on its
// peer (chunk c - nslots) and a receive only for the send of the same chunk, which has a lower
// rank. The item of lowest rank not done therefore always has what it waits for done or runnable,
// and every block that owes it work is at it (a block runs its items in rank order, so one that
// has not reached it is at an item of lower rank, all done): every item completes, whatever the
// schedule's shape, as long as all blocks of all ranks run concurrently (the grid is small; on one
// GPU several ranks need MPS to be co-resident, otherwise they time-slice).
//
// Split items: one block streams about 20 GB/s on an H100, so a large chunk on one block leaves
// the others idle (docs/gpu.md). Every block waits for the chunk's flag, moves its share, and
// arrives at the item's counter (arrive_last); the last to arrive stores the flag for the peer
// (ready after a send, freed after a receive). The counters live with the plan (one per item) and
// block 0 zeroes them after the last grid barrier, for the next launch of the plan.
//
// Small chunks (at most ll_bytes, COMMLIB_DEVICE_LL_BYTES) take the LL protocol instead
// (plan_ll.cuh: data and flag in one 64-bit store into the peer's LL slot, no fence, no flag
// round trip); both sides choose it from the chunk's bytes, which the plan check proves equal.
//
// The call's descriptor check (plan_call_check.cuh) runs first: block 0 exchanges and compares the
// call's descriptor with every peer of the plan, the other blocks wait in a grid barrier (barrier
// 0 of the launch when the plan has peers). A small call (one block, every rank a plan peer) folds
// it into its data handshakes instead: one cross-rank latency per call, not two.
//
// A small call's launch is one block (KernelPath::launch: every item at most ll_bytes): its grid
// barriers are the block's own __syncthreads (grid_barrier), and the deadlock argument below holds
// for any grid, one block included.
//
// Errors. Every wait loop polls the abort word (host memory the watchdog sets when the engine
// fails: a dead or mismatched peer, a timeout) and the kernel returns: no launch outlives the
// watchdog's verdict. Each block publishes its progress (items done) for the watchdog's timeout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device_plan_types.h"
#include "kernels/elementwise_kernel.h"
#include "kernels/plan_atomics.cuh"
#include "kernels/plan_bulk.cuh"
#include "kernels/plan_call_check.cuh"
#include "kernels/plan_done.cuh"
#include "kernels/plan_launch.cuh"
#include "kernels/plan_ll.cuh"
#include "kernels/plan_one_sided.cuh"

namespace commlib {
namespace kexec {

// Whether a chunk of `bytes` takes the LL protocol (both sides of a message decide alike).
__device__ __forceinline__ bool uses_ll(const PlanLaunch& a, uint32_t bytes) { return a.ll_bytes && bytes <= a.ll_bytes; }

// The message chunks a block moved in this launch, by protocol (the path record tests read).
struct ChunkCounts {
  uint32_t ll = 0, slots = 0;
};

// Where a send or receive item's chunk goes through (the protocol at the top), for run_item and
// run_split_item alike: its number across calls, its slot, the slot's memory, and the two flags of
// the handshake.
struct ChunkSlot {
  uint64_t c;             // the chunk's number in its pair (sent[p] or received[q], plus the item's)
  uint64_t s;             // its slot, c % nslots
  char* data;             // send: p's slots[me][s]; receive: this rank's slots[q][s]
  uint64_t* lines;        // the same slot's LL lines (ll_bytes / 4 words)
  const uint64_t* gate;   // the flag to wait for: this rank's freed[p][s] (send), ready[q][s] (receive)
  uint64_t gate_target;   // ... until at least this: c - nslots + 1 (0: the slot's first use), c + 1
  uint64_t* mark;         // the flag to store c + 1 into when done: p's ready[me][s], q's freed[me][s]
};

__host__ __device__ __forceinline__ ChunkSlot chunk_slot(const PlanLaunch& a, const kplan::PlanItem& it) {
  const bool send = it.kind == kplan::kSend;
  ChunkSlot cs;
  cs.c = (send ? a.sent[it.peer] : a.received[it.peer]) + it.chunk;
  cs.s = cs.c % a.nslots;
  const size_t at_peer = static_cast<size_t>(a.rank) * a.nslots + cs.s;  // [me][s] in the peer's region
  const size_t here = static_cast<size_t>(it.peer) * a.nslots + cs.s;    // [peer][s] in this rank's
  const PeerView& p = a.peers[it.peer];
  if (send) {
    cs.data = p.slots + at_peer * a.slot_bytes;
    cs.lines = p.ll + at_peer * (a.ll_bytes / 4);
    cs.gate = a.freed + here;
    cs.gate_target = cs.c >= a.nslots ? cs.c - a.nslots + 1 : 0;
    cs.mark = p.ready + at_peer;
  } else {
    cs.data = a.slots + here * a.slot_bytes;
    cs.lines = a.ll + here * (a.ll_bytes / 4);
    cs.gate = a.ready + here;
    cs.gate_target = cs.c + 1;
    cs.mark = p.freed + at_peer;
  }
  return cs;
}

// The block waits until the chunk's slot may be used (sent into, or read); false on abort.
__device__ __forceinline__ bool slot_wait(const PlanLaunch& a, const ChunkSlot& cs) {
  if (cs.gate_target == 0) return true;
  emu_count(kEmuPeerWaits, 1);
  return block_wait(cs.gate, cs.gate_target, a);
}

template <class F>
__device__ __forceinline__ bool run_item(const PlanLaunch& a, const kplan::PlanItem& it, const F& f, ChunkCounts& n) {
  char* dst = it.dst_buf < 3 ? a.bases[it.dst_buf] + it.dst_off : nullptr;
  const char* src = it.src_buf < 3 ? a.bases[it.src_buf] + it.src_off : nullptr;
  const size_t esize = sizeof(typename F::S);
  switch (it.kind) {
    case kplan::kCopy:
      block_copy(dst, src, it.bytes);
      return true;
    case kplan::kReduce:
      block_reduce(dst, dst, src, it.bytes / esize, f);
      return true;
    case kplan::kSend: {
      const ChunkSlot cs = chunk_slot(a, it);
      if (!slot_wait(a, cs)) return false;
      if (uses_ll(a, it.bytes)) {  // LL: no __syncthreads, no fence, no flag store
        ll_send(cs.lines, src, it.bytes, ll_flag(cs.c));
        ++n.ll;
        return true;
      }
      ++n.slots;
      block_copy(cs.data, src, it.bytes);
      block_sync();  // every thread's part of the chunk is written before the flag says so
      if (threadIdx.x == 0) release_store(cs.mark, cs.c + 1);
      return true;
    }
    default: {  // kRecv, kRecvReduce
      const ChunkSlot cs = chunk_slot(a, it);
      const char* slot = cs.data;
      if (uses_ll(a, it.bytes)) {  // LL: the lines carry their flags; unpacked into the block's stage
        char* stage = a.ll_stage + static_cast<size_t>(blockIdx.x) * a.ll_bytes;
        emu_count(kEmuPeerWaits, 1);
        if (!ll_recv(cs.lines, stage, it.bytes, ll_flag(cs.c), a.abort)) return false;
        slot = stage;
        ++n.ll;
      } else if (!slot_wait(a, cs)) {
        return false;
      } else {
        ++n.slots;
      }
      if (it.kind == kplan::kRecv)
        block_copy(dst, slot, it.bytes);
      else
        block_reduce(dst, src ? src : dst, slot, it.bytes / esize, f);
      // The slot's last chunk of an LL epoch: no line of an older epoch may alias the next one's
      // flags (plan_ll.cuh). The block's reads of the lines ended at ll_recv's barrier.
      if (a.ll_bytes && ll_epoch_ends(cs.c, a.nslots)) ll_scrub(cs.lines, a.ll_bytes / 4);
      block_sync();  // every thread is done reading the slot before it is handed back
      if (threadIdx.x == 0) release_store(cs.mark, cs.c + 1);
      return true;
    }
  }
}

// Whether every block runs a share of `it` (both sides of a message decide alike: the plan check
// proves a chunk's bytes equal; split_bytes exceeds ll_bytes, so a split chunk never takes LL).
__device__ __forceinline__ bool splits(const PlanLaunch& a, const kplan::PlanItem& it) {
  return a.split_bytes && it.bytes >= a.split_bytes && gridDim.x > 1;
}

// Item `idx` split over the grid (see "Split items" above). Returns false on abort.
template <class F>
__device__ __forceinline__ bool run_split_item(const PlanLaunch& a, uint32_t idx, const F& f, ChunkCounts& n) {
  const kplan::PlanItem& it = a.items[idx];
  char* dst = it.dst_buf < 3 ? a.bases[it.dst_buf] + it.dst_off : nullptr;
  const char* src = it.src_buf < 3 ? a.bases[it.src_buf] + it.src_off : nullptr;
  const size_t esize = sizeof(typename F::S);
  uint64_t lo, hi;
  share_of(it.bytes, lo, hi);
  switch (it.kind) {
    case kplan::kCopy:
      block_copy(dst + lo, src + lo, hi - lo);
      return true;
    case kplan::kReduce:
      block_reduce(dst + lo, dst + lo, src + lo, (hi - lo) / esize, f);
      return true;
    case kplan::kSend: {
      const ChunkSlot cs = chunk_slot(a, it);
      if (!slot_wait(a, cs)) return false;
      block_copy(cs.data + lo, src + lo, hi - lo);
      block_sync();  // this block's share is written before its arrival
      if (threadIdx.x == 0 && arrive_last(a.arrivals + idx, gridDim.x)) {
        release_store(cs.mark, cs.c + 1);
        ++n.slots;
      }
      return true;
    }
    default: {  // kRecv, kRecvReduce
      const ChunkSlot cs = chunk_slot(a, it);
      if (!slot_wait(a, cs)) return false;
      if (it.kind == kplan::kRecv)
        block_copy(dst + lo, cs.data + lo, hi - lo);
      else
        block_reduce(dst + lo, (src ? src : dst) + lo, cs.data + lo, (hi - lo) / esize, f);
      block_sync();  // this block is done reading its share before its arrival
      int last = 0;
      if (threadIdx.x == 0) last = arrive_last(a.arrivals + idx, gridDim.x);
      if (!block_any(last)) return true;  // (a barrier: every thread learns whether this block was last)
      // The slot's last chunk of an LL epoch (as run_item): no line of an older epoch may alias the
      // next one's flags; the last arriver scrubs, before the slot is handed back.
      if (a.ll_bytes && ll_epoch_ends(cs.c, a.nslots)) {
        ll_scrub(cs.lines, a.ll_bytes / 4);
        block_sync();
      }
      if (threadIdx.x == 0) {
        release_store(cs.mark, cs.c + 1);
        ++n.slots;
      }
      return true;
    }
  }
}

// The peers whose descriptors a launch with the check folded into its data handshakes compared so
// far (plan_call_check.cuh): bit p for peer p (the host folds only where size <= 64).
struct FoldedCheck {
  uint64_t seen = 0;
  bool all = false;
};

// Peer p's descriptor compared (once per launch); false on abort. The launch's one block.
__device__ __forceinline__ bool fold_check_peer(const PlanLaunch& a, FoldedCheck& fc, int p) {
  if ((fc.seen >> p) & 1) return true;
  int stop = 0;
  if (threadIdx.x == 0) stop = check_peer_thread0(a, p) ? 0 : 1;
  if (block_any(stop)) return false;
  fc.seen |= 1ull << p;
  emu_count(kEmuFoldedChecks, 1);
  return true;
}

// Every plan peer's descriptor compared: before the first write to a caller's buffer, and at the end.
__device__ __forceinline__ bool fold_check_all(const PlanLaunch& a, FoldedCheck& fc) {
  for (int p = 0; !fc.all && p < a.size; ++p)
    if (plan_peer(a, p) && !fold_check_peer(a, fc, p)) return false;
  fc.all = true;
  return true;
}

__device__ __forceinline__ bool is_message(const kplan::PlanItem& it) {
  return it.kind == kplan::kSend || it.kind == kplan::kRecv || it.kind == kplan::kRecvReduce;
}

// The launch's steps; false when the abort word released it.
template <class F>
__device__ __forceinline__ bool run_steps(const PlanLaunch& a, const F& f, uint64_t base, uint32_t first_barrier) {
  uint64_t done = 0;
  ChunkCounts moved;
  FoldedCheck fc;
  // The call's descriptor (plan_call_check.cuh) into the peers' rings, then, unless the check is
  // folded into the data handshakes, the exchange before the first step: block 0 checks, every
  // block waits for it in a grid barrier (counted as barrier 0; the steps' barriers follow).
  if (a.desc_ring_len && a.fold_check && threadIdx.x == 0) publish_call(a);  // (one block)
  if (first_barrier) {
    if (blockIdx.x == 0 && !check_call(a)) return false;
    if (!grid_barrier(a, base, 0)) return false;
  }
  // Folded: a step's messages before its local items (a step's operations are independent), so
  // that a local write to a caller's buffer, which waits for every peer's descriptor, never holds
  // this rank's sends back.
  const uint32_t passes = a.fold_check ? 2 : 1;
  bool any_split = false;
  for (uint32_t k = 0; k < a.nsteps; ++k) {
    const kplan::PlanStep st = a.steps[k];
    for (uint32_t pass = 0; pass < passes; ++pass)
      for (uint32_t j = 0; j < st.count; ++j) {
        const uint32_t idx = st.first + j;
        const kplan::PlanItem& it = a.items[idx];
        if (a.fold_check && is_message(it) == (pass == 1)) continue;  // the other pass's
        const bool split = splits(a, it);
        if (!split && j % gridDim.x != blockIdx.x) continue;  // another block's item
        if (a.fold_check) {  // a peer's descriptor before its chunk; every peer's before a caller's buffer
          if (it.kind != kplan::kSend && is_message(it) && !fold_check_peer(a, fc, it.peer)) return false;
          if (it.dst_buf < 2 && !fold_check_all(a, fc)) return false;
        }
        emu_perturb();
        any_split |= split;
        if (!(split ? run_split_item(a, idx, f, moved) : run_item(a, it, f, moved))) return false;
        if (threadIdx.x == 0 && blockIdx.x < kMaxBlocks) host_write(a.progress + blockIdx.x, ++done);
      }
    trace_step(a, k);  // the block's own end of the step: the grid barrier's wait counts in the next
    if (!grid_barrier(a, base, k + first_barrier)) return false;
  }
  // Folded: the peers this rank only sent to (their descriptors came with no chunk).
  if (a.fold_check && !fold_check_all(a, fc)) return false;
  // Past the last barrier every block has arrived at every split item: their counters start again
  // from 0 at the plan's next launch (stream-ordered after this one). Every block saw the same
  // split items, so block 0's any_split is the grid's.
  if (blockIdx.x == 0 && any_split)
    for (uint32_t i = threadIdx.x; i < a.nitems; i += blockDim.x) relaxed_store(a.arrivals + i, 0);
  // Every block is past the last barrier (no one reads the counters any more): the next call's
  // chunks and (folded) descriptor checks continue from here.
  if (blockIdx.x == 0)
    for (int p = threadIdx.x; p < a.size; p += blockDim.x) {
      a.sent[p] += a.sends_to[p];
      a.received[p] += a.recvs_from[p];
      if (a.fold_check && plan_peer(a, p)) a.checked[p] += 1;
    }
  // Device memory, plain accesses: only this block writes its words, launches run in order, and the
  // host reads them once the launches completed (a read of host memory here would cost a round trip
  // over PCIe at the end of every launch: docs/gpu.md "The GPU time of one call").
  if (threadIdx.x == 0 && blockIdx.x < kMaxBlocks) {
    uint64_t* mine = a.chunk_counts + 2 * blockIdx.x;
    mine[0] += moved.ll;
    mine[1] += moved.slots;
  }
  return true;
}

// A message plan's launch (a one-sided plan's: run_one_sided, plan_one_sided.cuh).
template <class F>
__device__ __forceinline__ void run_message_plan(const PlanLaunch& a, const F& f) {
  // The barrier's generation: written by the last block of the previous launch (end_launch), visible
  // here by stream order (kernel boundary); every block reads it before arriving anywhere.
  const uint64_t base = relaxed_load(a.barrier + kCounterGeneration);
  if (a.captured && blockIdx.x == 0 && threadIdx.x == 0)  // only end_launch advances the counter
    host_release_store(a.replays_started, relaxed_load(a.barrier + kCounterReplays) + 1);
  emu_count(kEmuMessageBlocks, 1);
  if (blockIdx.x == 0 && threadIdx.x == 0) emu_count(kEmuMessageLaunches, 1);
  const uint32_t first_barrier = a.desc_ring_len && !a.fold_check ? 1 : 0;
  // COMMLIB_DEVICE_TRACE (plan_trace.cuh): the block's start, each step's end before its grid
  // barrier, the header once every step is done.
  trace_begin(a);
  if (run_steps(a, f, base, first_barrier)) trace_end(a);
  end_launch(a, base, a.nsteps + first_barrier);
}

// Either executor, by the plan's kind. The CUDA launcher launches the two as separate kernels
// instead (cuda_plan_kernel.cu), so that neither's registers are sized for the other's body.
template <class F>
__device__ __forceinline__ void run_plan(const PlanLaunch& a, const F& f) {
  if (a.one_sided)
    run_one_sided(a, f);
  else
    run_message_plan(a, f);
}

}  // namespace kexec
}  // namespace commlib
