// The kernel executor of one-sided plans (kernels/one_sided_plan.h): run_one_sided, called by
// run_plan (plan_kernel.cuh) when the plan is one-sided. Written once for the GPU and the emulated
// device, like the rest of the executor.
//
// What it reads and writes. Every item addresses a buffer of this rank (a.bases: input, output,
// scratch) or, for get / get_reduce (source) and put (destination), the same buffer of its peer
// q, at a.peer_bases[q][buf]: the address in this process of q's buffer, mapped (IPC) before the
// call; reduce_to_all (the fused two-shot) reads and writes the same range of every rank's. On the *staged path* (docs/gpu.md) those are q's staging areas in q's kernel region: the
// kernel first copies the caller's input into this rank's staging area and, at the end, the staged
// output back (a.stage_user, a.stage_bytes).
//
// Blocks own byte ranges, not items. Every block runs every item of every step, moving its share
// (share_of: the item cut in gridDim.x parts of whole 64-byte lines) of the item's bytes, with
// kUnroll 16-byte loads in flight per thread, the tail included (plan_bulk.cuh). Signals and waits
// are per block: block b of rank r signals peer q's flag flags[r][tag][b] and waits on its own
// flags[q][tag][b]. No block waits for another block of its rank between steps: block locality
// (one_sided_plan.h, proven for every plan by check_one_sided_pairs) says that any two items that
// touch the same bytes of a rank's buffer address the same byte range, so block b's share of each
// is the same bytes, and what block b of q signals (its own shares, done) is exactly what block b
// here waits for. Within a block, __syncthreads between steps orders a step's writes before the
// next step's reads of the same bytes.
//
// Ordering, per handshake (one signal, one wait), two system-scope operations per block:
//   signal: the block's threads finish the step's data items; __syncthreads; thread 0 stores the
//           peer's flag (this rank's count of signals to it, + 1) with a RELEASE store at system
//           scope (peers are other processes, possibly on other GPUs);
//   wait:   thread 0 spins with RELAXED loads of its flag until it reaches the count it consumes,
//           then one ACQUIRE fence at system scope; __syncthreads; then the threads touch the data.
// The release store, read by the relaxed load, synchronises with the acquire fence after it
// (fence-store-load synchronisation in the PTX model: the release is a fence plus a store, the
// fence after the observing load is the acquire), and causality order runs through the CTA
// barriers on both sides, so every data access before the signal happens before every access
// after the wait, across processes. Data is moved with plain loads and stores: nothing on it. The
// counts only grow (per flag, one writer: block b of one peer; the counts of signals sent and
// consumed live in this rank's device memory, touched by thread 0 of block b only), so a stale
// read is too low: it waits, never skips. The grid barrier (device scope) runs only where the
// launch needs one: after the call's descriptor check (and the staged copy-in, which every
// block's signals publish) and, on the staged path, before the copy-out. The end of the launch is
// one device-scope arrival per block; the last to arrive advances the launch counters and stores
// the done word (release, system scope: the host reads it).
//
// Deadlock freedom: a block's waits are for signals its peers' block b sends in an earlier or the
// same step of theirs; the verifier proves every wait has its signal and that the signals
// precede the waits in a causal order with no cycle (ir.h). As for message plans, all blocks of
// all ranks must be resident together.
//
// Errors: the wait loop reads the abort word (host memory) only every kOneSidedAbortPollEvery
// spins, never on the first: a wait that succeeds quickly costs no PCIe round trip. Progress (one
// word per block, host memory) is written once per step.
#pragma once

#include <cstdint>

#include "kernels/plan_bulk.cuh"
#include "kernels/plan_call_check.cuh"
#include "kernels/plan_launch.cuh"
#include "kernels/plan_reduce_to_all.cuh"
#include "kernels/plan_trace.cuh"

namespace commlib {
namespace kexec {

#ifdef __CUDACC__
constexpr uint32_t kOneSidedAbortPollEvery = 16384;  // spins (each at least 100 ns once past 64)
#else
constexpr uint32_t kOneSidedAbortPollEvery = 256;  // spins of the emulated device (each a yield or 50 us)
#endif

__device__ __forceinline__ uint64_t* os_flag(uint64_t* flags, const PlanLaunch& a, int q, uint32_t tag) {
  return flags + (static_cast<size_t>(q) * (kplan::kSignalTags + 1) + tag) * a.os_blocks + blockIdx.x;
}

// Block-wide: consume one signal of (peer, tag) for this block; false on abort.
__device__ __forceinline__ bool os_wait(const PlanLaunch& a, const kplan::PlanItem& it) {
  int stop = 0;
  if (threadIdx.x == 0) {
    uint64_t* consumed = os_flag(a.os_consumed, a, it.peer, it.chunk);
    const uint64_t target = *consumed + 1;
    const uint64_t* flag = os_flag(a.os_flags, a, it.peer, it.chunk);
    uint32_t spins = 0;
    while (relaxed_load(flag) < target) {
      if (++spins % kOneSidedAbortPollEvery == 0 && abort_poll(a.abort)) {
        stop = 1;
        break;
      }
      pause(spins);
    }
    if (!stop) {
      acquire_fence_system();
      *consumed = target;
      emu_count(kEmuHandshakes, 1);
      emu_count(kEmuSysFences, 1);
    }
  }
  return !block_any(stop);
}

// Thread 0 after the block's barrier: one more signal to (peer, tag) for this block.
__device__ __forceinline__ void os_signal(const PlanLaunch& a, const kplan::PlanItem& it) {
  if (threadIdx.x != 0) return;
  uint64_t* sent = os_flag(a.os_signalled, a, it.peer, it.chunk);
  const uint64_t n = *sent + 1;
  *sent = n;
  release_store(os_flag(a.peers[it.peer].os_flags, a, a.rank, it.chunk), n);
  emu_count(kEmuSysFences, 1);
}

__device__ __forceinline__ char* peer_base(const PlanLaunch& a, int q, uint8_t buf) {
  return reinterpret_cast<char*>(a.peer_bases[static_cast<size_t>(q) * 3 + buf]);
}

// This block's share of a data item.
template <class F>
__device__ __forceinline__ void os_data(const PlanLaunch& a, const kplan::PlanItem& it, const F& f) {
  uint64_t lo, hi;
  share_of(it.bytes, lo, hi);
  if (hi <= lo) return;
  data_bytes_begin();  // the traffic counted is what the loads and stores below touch
  if (it.kind == kplan::kReduceToAll || it.kind == kplan::kReduceFromAll) {  // every rank's share (plan_reduce_to_all.cuh)
    block_reduce_to_all(a, it, lo, hi - lo, f);
    data_bytes_end(kEmuBytesRead, kEmuBytesWritten);
    return;
  }
  const bool remote_src = it.kind == kplan::kGet || it.kind == kplan::kGetReduce;
  char* dst = (it.kind == kplan::kPut ? peer_base(a, it.peer, it.dst_buf) : a.bases[it.dst_buf]) + it.dst_off + lo;
  const char* src = (remote_src ? peer_base(a, it.peer, it.src_buf) : a.bases[it.src_buf]) + it.src_off + lo;
  const uint64_t n = hi - lo;
  if (it.kind == kplan::kReduce || it.kind == kplan::kGetReduce)
    block_reduce(dst, dst, src, n / sizeof(typename F::S), f);
  else
    block_copy(dst, src, n);
  data_bytes_end(kEmuBytesRead, kEmuBytesWritten);
}

// The staged path's copies: this block's share of `bytes` from src to dst.
__device__ __forceinline__ void os_stage(char* dst, const char* src, uint64_t bytes) {
  uint64_t lo, hi;
  share_of(bytes, lo, hi);
  data_bytes_begin();
  if (hi > lo) block_copy(dst + lo, src + lo, hi - lo);
  data_bytes_end(kEmuStagedBytes, kEmuStagedBytes);  // loaded + stored
}

// A one-sided plan's steps; false when the abort word released it. `barriers` counts the grid
// barriers run (every block runs the same ones).
template <class F>
__device__ __forceinline__ bool os_steps(const PlanLaunch& a, const F& f, uint64_t base, uint32_t& barriers) {
  if (a.stage_user[0]) os_stage(a.bases[0], a.stage_user[0], a.stage_bytes[0]);
  // One grid barrier: the descriptor check (block 0) and the staged copy-in (every block) are done
  // before any block signals a peer.
  if (a.desc_ring_len || a.stage_user[0]) {
    if (a.desc_ring_len && blockIdx.x == 0 && !check_call(a)) return false;
    if (!grid_barrier(a, base, barriers++)) return false;
  }
  uint64_t done = 0;
  for (uint32_t k = 0; k < a.nsteps; ++k) {
    const kplan::PlanStep st = a.steps[k];
    bool synced = false;
    for (uint32_t idx = st.first; idx < st.first + st.count; ++idx) {
      const kplan::PlanItem& it = a.items[idx];
      if (it.kind == kplan::kWait) {
        if (!os_wait(a, it)) return false;
      } else if (it.kind == kplan::kSignal) {
        if (!synced) block_sync();  // every thread's data of the step is done before the first signal
        synced = true;
        os_signal(a, it);
      } else {
        emu_perturb();
        emu_data_path(true);
        os_data(a, it, f);
        emu_data_path(false);
      }
    }
    block_sync();  // the step's writes before the next step's reads (the same bytes: same block)
    if (threadIdx.x == 0 && blockIdx.x < kMaxBlocks) host_write(a.progress + blockIdx.x, ++done);
    trace_step(a, k);
  }
  if (a.stage_user[1]) {  // every block's final waits passed: the whole staged output is final
    if (!grid_barrier(a, base, barriers++)) return false;
    os_stage(a.stage_user[1], a.bases[1], a.stage_bytes[1]);
  }
  if (a.staged_release) {  // tag kSignalTags: the kernel's own (kernel_path_one_sided.cc says why)
    block_sync();
    kplan::PlanItem it;
    it.chunk = kplan::kSignalTags;
    for (int p = 0; p < a.size; ++p)
      if (p != a.rank) {
        it.peer = p;
        os_signal(a, it);
      }
    for (int p = 0; p < a.size; ++p)
      if (p != a.rank) {
        it.peer = p;
        if (!os_wait(a, it)) return false;
      }
  }
  return true;
}

// A one-sided plan's launch: its steps, then the launch's end (plan_done.cuh), however the steps
// ended, so the host's completion word means what it means for a message plan.
template <class F>
__device__ __forceinline__ void run_one_sided(const PlanLaunch& a, const F& f) {
  const uint64_t base = relaxed_load(a.barrier + kCounterGeneration);
  if (a.captured && blockIdx.x == 0 && threadIdx.x == 0)
    release_store(a.replays_started, relaxed_load(a.barrier + kCounterReplays) + 1);
  emu_count(kEmuBlockRuns, 1);
  if (blockIdx.x == 0) emu_count(kEmuOneSidedLaunches, 1);
  uint32_t barriers = 0;
  // Released by the abort word (false), blocks may have run different numbers of barriers: the
  // engine has failed and launches nothing more, so the counters end_launch advances are not read.
  trace_begin(a);
  if (os_steps(a, f, base, barriers)) trace_end(a);
  end_launch(a, base, barriers);
}

}  // namespace kexec
}  // namespace commlib
