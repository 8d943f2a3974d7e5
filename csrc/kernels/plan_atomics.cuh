// The few memory operations the kernel executor (plan_kernel.cuh) synchronises with, written once
// for the GPU and for the emulated device, which runs the same kernel body on host threads:
//   - flags: 64-bit words written with release stores and read with acquire loads at system scope
//     (a peer process on the same GPU, another GPU over NVLink, or the host reads them);
//   - the grid barrier's counter: an acq_rel fetch-add at device scope;
//   - a split item's arrivals: an acq_rel fetch-add at system scope (arrive_last);
//   - block_sync: __syncthreads on the GPU; nothing on the emulated device, which runs one thread
//     per block (a block's threads there are one host thread, so there is nothing to order);
//     block_any: __syncthreads_or (a barrier that also tells every thread whether any thread's
//     predicate was set; no shared variable to race on);
//   - LL lines (the small-message protocol, plan_ll.cuh): 64-bit words stored and loaded RELAXED at
//     system scope, each one single-copy atomic, so a reader that sees a line's flag half sees the
//     data half of the same store;
//   - pause: the back-off of a wait loop (__nanosleep; on the host yield, then sleep, so that
//     spinning ranks on a 2-core machine leave the cores to the ranks they wait for);
//   - emu_perturb: COMMLIB_EMULATED_DELAY_US on the emulated device (a random delay before each
//     item, per block), nothing on the GPU.
#pragma once

#include <cstdint>

#include "kernels/cuda_shim.h"

#ifdef __CUDACC__
#include <cuda/atomic>
#else
#include <chrono>
#include <thread>
#define __shared__
#endif

namespace commlib {
namespace kexec {

// What the emulated device counts of a launch (emu_count; nothing on the GPU): issue #38 item 5.
enum EmuCounter : unsigned {
  kEmuBytesRead,         // data items' bytes loaded (a reduction loads both operands)
  kEmuBytesWritten,      // data items' bytes stored
  kEmuStagedBytes,       // the staged path's copies in and out (loaded + stored)
  kEmuSysFences,         // system-scope release stores and acquire fences of one-sided signals and waits
  kEmuHandshakes,        // one-sided waits completed (each pairs with a peer's signal)
  kEmuGridBarriers,      // grid barriers, per block
  kEmuBlockRuns,         // blocks run by one-sided launches
  kEmuHostReads,         // host-memory (mapped) words read by one-sided launches
  kEmuHostWrites,        // ... and written
  kEmuHostDataAccesses,  // host-memory words read or written while a data item runs
  // Message plans (plan_kernel.cuh; issue #37: what a small call's launch costs):
  kEmuMessageLaunches,   // launches of message plans (block 0 counts)
  kEmuMessageBlocks,     // their blocks (each block counts itself): the grid, per launch
  kEmuPeerWaits,         // waits on a word a peer writes: a chunk's gate or LL lines, a peer's descriptor
  kEmuCheckExchanges,    // descriptor checks run as an exchange before the first step (plan_call_check.cuh)
  kEmuFoldedChecks,      // peers' descriptors compared inside the data handshakes instead
  kEmuTraceStores,       // COMMLIB_DEVICE_TRACE's stamps and row headers stored (plan_trace.cuh); 0 when off
  kEmuAbortPolls,        // reads of the abort word inside waits (abort_poll), every plan's; each is a host read too
  kEmuOneSidedLaunches,  // launches of one-sided plans (block 0 counts): block_runs / this is the grid
  kEmuCounters
};

#ifdef __CUDACC__

__device__ __forceinline__ uint64_t acquire_load(const uint64_t* p) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system> a(*const_cast<uint64_t*>(p));
  return a.load(cuda::memory_order_acquire);
}
__device__ __forceinline__ uint64_t relaxed_load(const uint64_t* p) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system> a(*const_cast<uint64_t*>(p));
  return a.load(cuda::memory_order_relaxed);
}
__device__ __forceinline__ void release_store(uint64_t* p, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}
__device__ __forceinline__ void relaxed_store(uint64_t* p, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_relaxed);
}
__device__ __forceinline__ void arrive(uint64_t* p) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*p).fetch_add(1, cuda::memory_order_acq_rel);
}
// One arrival of `of` at a shared item (plan_kernel.cuh, split items): whether it was the last.
// acq_rel at system scope: the last arriver then has every other block's writes (ordered before
// their arrival by the CTA barrier) before its release of the item's flag to a peer.
__device__ __forceinline__ bool arrive_last(uint64_t* p, uint64_t of) {
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).fetch_add(1, cuda::memory_order_acq_rel) + 1 == of;
}
__device__ __forceinline__ uint64_t acquire_load_device(const uint64_t* p) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_device> a(*const_cast<uint64_t*>(p));
  return a.load(cuda::memory_order_acquire);
}
__device__ __forceinline__ void block_sync() { __syncthreads(); }
__device__ __forceinline__ bool block_any(int pred) { return __syncthreads_or(pred) != 0; }
__device__ __forceinline__ void ll_store(uint64_t* p, uint64_t v) { relaxed_store(p, v); }
__device__ __forceinline__ uint64_t ll_load(const uint64_t* p) { return relaxed_load(p); }
__device__ __forceinline__ void pause(uint32_t& spins) {
  if (++spins > 64) __nanosleep(spins > 4096 ? 1000 : 100);
}
__device__ __forceinline__ void emu_perturb() {}
__device__ __forceinline__ void emu_count(EmuCounter, uint64_t) {}
// The GPU's global nanosecond timer (one clock for every SM of the device: COMMLIB_DEVICE_TRACE's stamps).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void emu_data_path(bool) {}
// The data loads and stores of the bulk loops (plan_bulk.cuh, plan_reduce_to_all.cuh): plain
// accesses here; on the emulated device each also counts its bytes (below).
template <class T>
__device__ __forceinline__ T data_load(const T* p) { return *p; }
template <class T>
__device__ __forceinline__ void data_store(T* p, const T& v) { *p = v; }
__device__ __forceinline__ void data_bytes(uint64_t, uint64_t) {}
__device__ __forceinline__ void data_bytes_begin() {}
__device__ __forceinline__ void data_bytes_end(EmuCounter, EmuCounter) {}
// The acquire half of a one-sided wait (plan_one_sided.cuh): after a relaxed load saw the flag.
__device__ __forceinline__ void acquire_fence_system() {
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
}
// One arrival at the end of a launch: the counter's value before it.
__device__ __forceinline__ uint64_t arrive_fetch(uint64_t* p) {
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*p).fetch_add(1, cuda::memory_order_acq_rel);
}
// Words of the host page (mapped host memory): the abort word, progress, the completion words.
__device__ __forceinline__ uint64_t host_read(const uint64_t* p) { return relaxed_load(p); }
__device__ __forceinline__ void host_write(uint64_t* p, uint64_t v) { relaxed_store(p, v); }
__device__ __forceinline__ void host_release_store(uint64_t* p, uint64_t v) { release_store(p, v); }
// A wait's poll of the abort word (host memory the watchdog sets): a host read like any other.
__device__ __forceinline__ uint64_t abort_poll(const uint64_t* abort) { return host_read(abort); }

#else

inline uint64_t acquire_load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint64_t relaxed_load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void release_store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void relaxed_store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline void arrive(uint64_t* p) { __atomic_fetch_add(p, 1, __ATOMIC_ACQ_REL); }
inline bool arrive_last(uint64_t* p, uint64_t of) { return __atomic_fetch_add(p, 1, __ATOMIC_ACQ_REL) + 1 == of; }
inline uint64_t acquire_load_device(const uint64_t* p) { return acquire_load(p); }
inline void block_sync() {}
inline bool block_any(int pred) { return pred != 0; }
inline void ll_store(uint64_t* p, uint64_t v) { relaxed_store(p, v); }
inline uint64_t ll_load(const uint64_t* p) { return relaxed_load(p); }
inline void pause(uint32_t& spins) {
  ++spins;
  if (spins > 2048)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  else if (spins > 16)
    std::this_thread::yield();
}
// Set by the emulated launch for the block it runs (device/emulated/emulated_plan_kernel.cc).
extern thread_local int64_t emu_delay_us;
extern thread_local uint64_t emu_rng;
// Counts of the running launch (emulated_plan_kernel.cc), and whether this block is in a data item.
void emu_count(EmuCounter c, uint64_t n);
extern thread_local bool emu_in_data;
inline void emu_data_path(bool in) { emu_in_data = in; }
// The data loads and stores of the bulk loops, counted where they happen (issue #38 item 5: the
// traffic counters are what the kernel's loads and stores touched, so a stray store shows): each
// adds its bytes to this host thread's tally (the block's: a block is one host thread), and the
// item that ran them moves the tally into the launch's counters (data_bytes_end). data_bytes: an
// element-wise access of the unaligned paths (gpu::load_any / store_any), counted alike.
extern thread_local uint64_t emu_loaded, emu_stored;
template <class T>
inline T data_load(const T* p) {
  emu_loaded += sizeof(T);
  return *p;
}
template <class T>
inline void data_store(T* p, const T& v) {
  emu_stored += sizeof(T);
  *p = v;
}
inline void data_bytes(uint64_t loaded, uint64_t stored) {
  emu_loaded += loaded;
  emu_stored += stored;
}
inline void data_bytes_begin() { emu_loaded = emu_stored = 0; }
// The tally since data_bytes_begin into `loaded` and `stored` (the same counter: both into it).
inline void data_bytes_end(EmuCounter loaded, EmuCounter stored) {
  emu_count(loaded, emu_loaded);
  emu_count(stored, emu_stored);
  emu_loaded = emu_stored = 0;
}
inline void acquire_fence_system() { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
// The emulated device's %globaltimer: the host's monotonic clock, which every rank of the host shares.
inline uint64_t global_timer_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
inline uint64_t arrive_fetch(uint64_t* p) { return __atomic_fetch_add(p, 1, __ATOMIC_ACQ_REL); }
inline uint64_t host_read(const uint64_t* p) {
  emu_count(kEmuHostReads, 1);
  if (emu_in_data) emu_count(kEmuHostDataAccesses, 1);
  return relaxed_load(p);
}
inline void host_write(uint64_t* p, uint64_t v) {
  emu_count(kEmuHostWrites, 1);
  if (emu_in_data) emu_count(kEmuHostDataAccesses, 1);
  relaxed_store(p, v);
}
// A wait's poll of the abort word (host memory the watchdog sets), in every plan's waits: counted
// as a host read, and as a poll, so that the tests tell the polls from any other host read.
inline uint64_t abort_poll(const uint64_t* abort) {
  emu_count(kEmuAbortPolls, 1);
  return host_read(abort);
}
// A completion word of the host page (the done words, a replay's start): a release store, counted as a write.
inline void host_release_store(uint64_t* p, uint64_t v) {
  emu_count(kEmuHostWrites, 1);
  release_store(p, v);
}
inline void emu_perturb() {
  if (emu_delay_us <= 0) return;
  emu_rng = emu_rng * 6364136223846793005ull + 1442695040888963407ull;
  const int64_t us = static_cast<int64_t>((emu_rng >> 33) % static_cast<uint64_t>(emu_delay_us + 1));
  if (us) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

#endif

}  // namespace kexec
}  // namespace commlib
