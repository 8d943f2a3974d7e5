// The call-descriptor check of the kernel path, inside the kernel (issue #25): before the first
// step, block 0 of every rank writes this call's descriptor into the descriptor ring of every peer
// of its plan, waits for each peer's descriptor in its own ring with the same acquire loop as a
// chunk's flag (polling the abort word), and compares. Equal everywhere: the grid barrier that
// follows lets every block start the first step. Different: block 0 writes a mismatch record into
// the host page (what the watchdog turns into MismatchError naming both ranks and both calls) and
// waits for the abort word; the other blocks wait in the barrier, which polls it too. So a call on
// the kernel path enqueues no host function at all (the copy path's check needs two per call).
//
// The ring. Rank r's kernel region holds, per sender q, `ring_len` entries of kDescWords words:
// word 0 the pair's check number + 1 (a flag that only grows), words 1..3 the CallDesc. Both ranks
// of a pair number the kernel calls whose plans join them (checked[p], on the device, advanced by
// block 0 after each check), and entry k % ring_len holds check k. The writer stores the
// descriptor's words, then release-stores the flag at system scope; the reader acquire-loads the
// flag until it reaches k + 1, then reads the words: the same release/acquire pair as a chunk.
//
// Why ring_len = nslots + 1 entries are never overwritten unread. Suppose sender A writes check
// k' while receiver B has not read check k' - ring_len. B then has not started any of the calls
// k' - ring_len .. k' - 1 with A past its check, so it has consumed no chunk of them from A and sent
// none to A. A finished those ring_len calls, each moving at least one chunk between the pair (a
// plan's peer has a message; a zero-byte message is one chunk), none received from B (B sent
// none), so at least ring_len = nslots + 1 chunks to B with none consumed: but A's send of chunk c
// waits for B's consumption of chunk c - nslots. Contradiction.
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

// Thread 0 of block 0 only. Returns false when the abort word was set (a peer failed, a mismatch
// was found here and the watchdog failed the engine, or a timeout). `L` is the kernel's PlanLaunch.
template <class L>
__device__ __forceinline__ bool check_call_thread0(const L& a) {
  const uint32_t R = a.desc_ring_len;
  for (int p = 0; p < a.size; ++p) {  // publish: into every peer's ring, entry of this rank
    if (p == a.rank || (a.sends_to[p] | a.recvs_from[p]) == 0) continue;
    const uint64_t k = a.checked[p];
    uint64_t* e = a.peers[p].descs + (static_cast<size_t>(a.rank) * R + k % R) * kDescWords;
    for (uint32_t w = 0; w < 3; ++w) relaxed_store(e + 1 + w, a.desc[w]);
    release_store(e, k + 1);
  }
  for (int p = 0; p < a.size; ++p) {  // wait for every peer's and compare
    if (p == a.rank || (a.sends_to[p] | a.recvs_from[p]) == 0) continue;
    const uint64_t k = a.checked[p];
    const uint64_t* e = a.descs + (static_cast<size_t>(p) * R + k % R) * kDescWords;
    uint32_t spins = 0;
    while (acquire_load(e) < k + 1) {
      if (spins % kCheckAbortPollEvery == 0 && relaxed_load(a.abort)) return false;
      pause(spins);
    }
    uint64_t theirs[3];
    bool same = true;
    for (uint32_t w = 0; w < 3; ++w) {
      theirs[w] = relaxed_load(e + 1 + w);
      same = same && theirs[w] == a.desc[w];
    }
    if (!same) {  // the record, then wait for the watchdog's verdict (the call must not complete)
      for (uint32_t w = 0; w < 3; ++w) {
        relaxed_store(a.mismatch + 1 + w, a.desc[w]);
        relaxed_store(a.mismatch + 4 + w, theirs[w]);
      }
      release_store(a.mismatch, static_cast<uint64_t>(p) + 1);
      while (!relaxed_load(a.abort)) pause(spins);
      return false;
    }
    a.checked[p] = k + 1;  // this rank's block 0 only; the next launch reads it in stream order
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
