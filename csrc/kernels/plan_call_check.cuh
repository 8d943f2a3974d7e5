// The call-descriptor check of the kernel path, inside the kernel (issue #25; folded into the data
// handshakes, issue #37). At the start of a launch block 0 of every rank writes this call's
// descriptor into the descriptor ring of every peer of its plan (publish_call: no wait). The check
// then takes one of two forms, chosen per launch by the host (PlanLaunch::fold_check):
//   - an EXCHANGE before the first step (check_call): block 0 waits for every peer's descriptor in
//     its own ring with the same acquire loop as a chunk's flag (polling the abort word) and
//     compares; the other blocks wait in a grid barrier (barrier 0 of the launch);
//   - FOLDED into the data handshakes (plan_kernel.cuh, a launch of one block whose plan joins
//     every other rank: a small call): no wait before the first step; the block compares peer q's
//     descriptor just before its first receive from q (q wrote it before its first chunk, so it is
//     there when the chunk is: one cross-rank latency per call instead of two), and every peer's
//     before its first write to a caller's buffer (input or output) and before the launch ends
//     (peers it only sends to). Since the plan joins every rank, no caller's buffer is written
//     before this rank saw every rank's descriptor: a mismatched call still writes nothing.
// Equal everywhere: the launch goes on. Different: the block writes a mismatch record into the
// host page (what the watchdog turns into MismatchError naming both ranks and both calls) and waits
// for the abort word; other blocks wait in the barrier, which polls it too. So a call on the kernel
// path enqueues no host function at all (the copy path's check needs two per call).
//
// The ring. Rank r's kernel region holds, per sender q, `ring_len` entries of kDescWords words:
// word 0 the pair's check number + 1 (a flag that only grows), words 1..3 the CallDesc. Both ranks
// of a pair number the kernel calls whose plans join them (checked[p], on the device: advanced by
// block 0 after an exchange, or at the end of a folded launch), and entry k % ring_len holds check
// k. The writer stores the descriptor's words, then release-stores the flag at system scope; the
// reader acquire-loads the flag until it reaches k + 1, then reads the words: the same
// release/acquire pair as a chunk.
//
// Why ring_len = nslots + 2 entries are never overwritten unread. Suppose sender A writes check k'
// (at the start of its call k') while receiver B may still read check k' - ring_len: B is at most in
// call k' - ring_len (a folded check reads as late as the end of its launch), so B has started none
// of the calls k' - ring_len + 1 .. k' - 1 (ring_len - 1 = nslots + 1 of them). A finished those: in
// none of them could A receive from B or read B's descriptor (B wrote none), and each moves at least
// one message between the pair (a plan's peer has a message; a zero-byte message is one chunk), so
// A sent at least nslots + 1 chunks to B with none consumed; but A's send of chunk c waits for B's
// consumption of chunk c - nslots. Contradiction. (An exchange reads before any chunk moves, which
// nslots + 1 entries would do for; the folded reads need the one more.)
//
// Two ranks that disagree on whether a call joins them (a different collective or root) disagree on
// the check numbers from there on: the first rank's wait is answered by the peer's next call with
// it (a different descriptor: a mismatch), or by nobody, where the watchdog compares the calls the
// ranks published on the control plane (published at enqueue) and the timeout ends the wait.
#pragma once

#include <cstdint>

#include "kernels/plan_atomics.cuh"

namespace commlib {
namespace kexec {

constexpr uint32_t kDescWords = 4;     // flag + the CallDesc's 24 bytes
constexpr uint32_t kMismatchWords = 8;  // peer + 1, my descriptor (3 words), theirs (3 words)
constexpr uint32_t kCheckAbortPollEvery = 16;  // spins between reads of the abort word (host memory)

// Whether peer p is in this launch's plan (it has a message with this rank).
template <class L>
__device__ __forceinline__ bool plan_peer(const L& a, int p) {
  return p != a.rank && (a.sends_to[p] | a.recvs_from[p]) != 0;
}

// Thread 0 of block 0: this call's descriptor into every plan peer's ring (entry of this rank).
template <class L>
__device__ __forceinline__ void publish_call(const L& a) {
  const uint32_t R = a.desc_ring_len;
  for (int p = 0; p < a.size; ++p) {
    if (!plan_peer(a, p)) continue;
    const uint64_t k = a.checked[p];
    uint64_t* e = a.peers[p].descs + (static_cast<size_t>(a.rank) * R + k % R) * kDescWords;
    for (uint32_t w = 0; w < 3; ++w) relaxed_store(e + 1 + w, a.desc[w]);
    release_store(e, k + 1);
  }
}

// One thread: waits for peer p's descriptor of this launch's check and compares. False when the
// abort word was set (a peer failed, a timeout, or a mismatch found here: recorded, then the wait
// for the watchdog's verdict, so the call cannot complete before it). `L` is the kernel's PlanLaunch.
template <class L>
__device__ __forceinline__ bool check_peer_thread0(const L& a, int p) {
  const uint32_t R = a.desc_ring_len;
  const uint64_t k = a.checked[p];
  const uint64_t* e = a.descs + (static_cast<size_t>(p) * R + k % R) * kDescWords;
  uint32_t spins = 0;
  emu_count(kEmuPeerWaits, 1);
  while (acquire_load(e) < k + 1) {
    if (spins % kCheckAbortPollEvery == 0 && abort_poll(a.abort)) return false;
    pause(spins);
  }
  uint64_t theirs[3];
  bool same = true;
  for (uint32_t w = 0; w < 3; ++w) {
    theirs[w] = relaxed_load(e + 1 + w);
    same = same && theirs[w] == a.desc[w];
  }
  if (same) return true;
  for (uint32_t w = 0; w < 3; ++w) {
    relaxed_store(a.mismatch + 1 + w, a.desc[w]);
    relaxed_store(a.mismatch + 4 + w, theirs[w]);
  }
  release_store(a.mismatch, static_cast<uint64_t>(p) + 1);
  while (!abort_poll(a.abort)) pause(spins);
  return false;
}

// Thread 0 of block 0, the exchange: publish, then wait for every peer's and compare.
template <class L>
__device__ __forceinline__ bool check_call_thread0(const L& a) {
  publish_call(a);
  emu_count(kEmuCheckExchanges, 1);
  for (int p = 0; p < a.size; ++p) {
    if (!plan_peer(a, p)) continue;
    if (!check_peer_thread0(a, p)) return false;
    a.checked[p] += 1;  // this rank's block 0 only; the next launch reads it in stream order
  }
  return true;
}

// Block 0's part of the check, the whole block learning the outcome.
template <class L>
__device__ __forceinline__ bool check_call(const L& a) {
  int stop = 0;
  if (threadIdx.x == 0) stop = check_call_thread0(a) ? 0 : 1;
  return !block_any(stop);
}

}  // namespace kexec
}  // namespace commlib
