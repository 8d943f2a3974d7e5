// The kernel executor's small-message protocol (in the spirit of NCCL's LL): a chunk of at most
// COMMLIB_DEVICE_LL_BYTES moves as LINES, one 64-bit word per 4 bytes of data, the high half the
// chunk's flag (its pair-wide number + 1, truncated to 32 bits), the low half the data. The sender
// stores each line with one relaxed 64-bit store at system scope straight into the receiver's LL
// area; the receiver's threads poll their own lines until the flag half is the one they expect.
//
// Why no fence and no separate flag: a naturally aligned 64-bit atomic access is single-copy
// atomic (PTX memory model; std::atomic on the host), so a load that returns the new flag half
// returns the data half written by the same store: there is nothing between data and flag to
// order. The slow protocol pays a __syncthreads, a system-scope release (a fence.sys on the GPU)
// and a second round trip (the reader sees the flag, then reads the data); LL pays none of them,
// at the price of half the bandwidth (4 data bytes per 8 moved), hence only for small chunks.
//
// A line is never mistaken for another chunk's: chunk c of a pair uses slot c % nslots, whose
// lines last held chunk c - nslots (flag c - nslots + 1) or a slow-protocol chunk (lines untouched)
// or nothing (zeros; flags start at 1). The limit of a 32-bit flag (NCCL's LL has the same kind):
// a line last written exactly k * 2^32 chunks of the pair earlier (a long run of shorter chunks
// through the slot since) would be taken for the current chunk's. Reuse of a slot's lines is ordered as
// in the slow protocol: the receiver's loads, __syncthreads, its release store of freed; the
// sender's acquire load of freed, then its stores of chunk c + nslots.
//
// The receiver unpacks the lines into a block-private stage (this rank's memory, one per block)
// and then copies or reduces from it with the same code as the slow protocol; the stage belongs
// to one block, whose items run one after another, so no other block or rank touches it.
#pragma once

#include <cstdint>

#include "kernels/plan_atomics.cuh"

namespace commlib {
namespace kexec {

constexpr uint32_t kLLPollAbortEvery = 256;  // spins per thread between reads of the abort word

__device__ __forceinline__ uint32_t ll_lines(uint32_t bytes) { return bytes ? (bytes + 3) / 4 : 1; }

// Bytes 4i..4i+3 of src (little-endian; zero past `bytes`).
__device__ __forceinline__ uint32_t ll_word(const char* src, uint32_t i, uint32_t bytes) {
  const uint32_t at = 4 * i;
  if (at + 4 <= bytes && reinterpret_cast<uintptr_t>(src) % 4 == 0)
    return *reinterpret_cast<const uint32_t*>(src + at);
  uint32_t w = 0;
  for (uint32_t b = 0; b < 4 && at + b < bytes; ++b) w |= static_cast<uint32_t>(static_cast<uint8_t>(src[at + b])) << (8 * b);
  return w;
}

// The block's threads store the chunk's lines into the receiver's LL slot `lines`.
__device__ __forceinline__ void ll_send(uint64_t* lines, const char* src, uint32_t bytes, uint32_t flag) {
  const uint64_t hi = static_cast<uint64_t>(flag) << 32;
  const uint32_t n = ll_lines(bytes);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ll_store(lines + i, hi | ll_word(src, i, bytes));
}

// The block's threads wait for the chunk's lines and unpack them into `stage` (4-byte aligned,
// room for ll_lines(bytes) words); false when the abort word was set (every thread learns it).
__device__ __forceinline__ bool ll_recv(const uint64_t* lines, char* stage, uint32_t bytes, uint32_t flag,
                                        const uint64_t* abort) {
  const uint32_t n = ll_lines(bytes);
  int stop = 0;
  for (uint32_t i = threadIdx.x; i < n && !stop; i += blockDim.x) {
    uint64_t v;
    uint32_t spins = 0;
    while (static_cast<uint32_t>((v = ll_load(lines + i)) >> 32) != flag) {
      if (spins % kLLPollAbortEvery == kLLPollAbortEvery - 1 && relaxed_load(abort)) {
        stop = 1;
        break;
      }
      pause(spins);
    }
    if (!stop) reinterpret_cast<uint32_t*>(stage)[i] = static_cast<uint32_t>(v);
  }
  return !block_any(stop);  // also orders the stage's writes before the block's reads of it
}

}  // namespace kexec
}  // namespace commlib
