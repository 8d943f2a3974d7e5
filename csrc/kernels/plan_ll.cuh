// The kernel executor's small-message protocol (in the spirit of NCCL's LL): a chunk of at most
// COMMLIB_DEVICE_LL_BYTES moves as LINES, one 64-bit word per 4 bytes of data, the high half the
// chunk's flag (from its pair-wide number: ll_flag, never zero), the low half the data. The sender
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
// A line is never mistaken for another chunk's. Flags run 1..2^32-1 (chunk c's flag is
// c mod (2^32 - 1) + 1), so zero, what fresh and scrubbed lines hold, is never a flag. Within an
// EPOCH of 2^32 - 1 chunks of a pair the flags are distinct, so a line of slot s holds the flag of
// an earlier chunk of the epoch through s, or zero; the only lines that could alias are ones left
// from an earlier epoch (a slot whose lines were last written exactly 2^32 - 1 chunks earlier, the
// chunks since having taken the slow protocol or been shorter). The receiver therefore SCRUBS a
// slot (zeroes all its lines) when it consumes the slot's last chunk of an epoch (either protocol),
// before it hands the slot back through freed: the sender's stores of the slot's first chunk of the
// next epoch come after its acquire of that freed, so they follow the zeros, and a later reader of
// the slot (a later step or launch: after the grid barrier or in stream order) sees zeros or the new
// chunk. (A reader in the same step, possible only for one message of more than nslots LL chunks,
// i.e. COMMLIB_DEVICE_LL_BYTES equal to the slot, polls lines that chunk c - nslots of the same
// message wrote in full.) Reuse of a slot's lines is ordered as in the slow protocol: the receiver's
// loads, __syncthreads, its release store of freed; the sender's acquire load of freed, then its
// stores of chunk c + nslots. A test starts the pair's chunk numbers just before 2^32 - 1
// (KernelPath::start_chunk_numbers_at) to cross an epoch.
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

constexpr uint64_t kLLEpoch = 0xffffffffull;  // chunks per epoch: flags 1..2^32-1, never zero

__device__ __forceinline__ uint32_t ll_lines(uint32_t bytes) { return bytes ? (bytes + 3) / 4 : 1; }

// The flag of a pair's chunk c (never zero).
__device__ __forceinline__ uint32_t ll_flag(uint64_t c) { return static_cast<uint32_t>(c % kLLEpoch) + 1; }

// Whether chunk c is its slot's last of an epoch (the slot's next chunk, c + nslots, is in the next).
__device__ __forceinline__ bool ll_epoch_ends(uint64_t c, uint32_t nslots) {
  return c / kLLEpoch != (c + nslots) / kLLEpoch;
}

// The block's threads zero a slot's `nlines` lines (the receiver, before handing the slot back).
__device__ __forceinline__ void ll_scrub(uint64_t* lines, uint32_t nlines) {
  for (uint32_t i = threadIdx.x; i < nlines; i += blockDim.x) ll_store(lines + i, 0);
}

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
      if (spins % kLLPollAbortEvery == kLLPollAbortEvery - 1 && abort_poll(abort)) {
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
