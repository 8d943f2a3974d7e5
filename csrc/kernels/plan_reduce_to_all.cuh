// The fused two-shot's data item (kplan::kReduceToAll, schedule/ir.h reduce_to_all): a block's share
// of the same byte range of every rank's source, read once, reduced in rank order 0..P-1 in
// registers, and the result stored into the same range of every rank's destination. Per rank and
// call that is N bytes read and N written for an all_reduce of N bytes (the issue's 2 N), where the
// two-shot of get_reduce steps round-trips an accumulator through memory P - 1 times and gathers
// the other blocks afterwards (4.25 N at P = 4). The fused reduce_scatter's item
// (kplan::kReduceFromAll, reduce_from_all) is the same with the result stored into this rank's
// destination only: N read and N / P written per rank for a reduce_scatter of N input bytes.
//
// Loads in flight: each thread loads W = 4 16-byte packs of one rank (the tail too, predicated),
// folds them into its W accumulators, then the next rank's; the stores follow the last rank's fold.
// The accumulators live across the ranks' loop, so their registers decide what fits the 128 of a
// 512-thread block (a spill fails the build; kUnroll = 8 spilled for every type at sm_80/90): 4-
// and 8-byte elements are one or two registers each, and 1- and 2-byte elements stay packed in
// 32-bit words (gpu::WordFold: 4 registers per pack, each element unpacked only while f runs on
// it, so the bits are f's element by element; unpacked, one register per element, float16 spilled
// at W = 2). float16 packed spilled too while its conversions were integer code; on the GPU's cvt
// instructions (float_bits.h) it takes 109-119 registers at sm_80/90, like the others. A thread stores an
// element only after it loaded that element from every rank, so in place (the destination is the
// source) nothing is overwritten before it was read, and no other thread or block touches it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/plan_bulk.cuh"
#include "kernels/plan_launch.cuh"

namespace commlib {
namespace kexec {

// Rank q's buffer `buf` as this launch addresses it: this rank's own (a.bases: the staging area on
// the staged path) or the peer's (a.peer_bases: mapped, or the peer's staging area).
__device__ __forceinline__ char* rank_buffer(const PlanLaunch& a, int q, uint8_t buf) {
  return q == a.rank ? a.bases[buf] : reinterpret_cast<char*>(a.peer_bases[static_cast<size_t>(q) * 3 + buf]);
}

// How a thread holds and folds a 16-byte pack of F's elements: as they are (4- and 8-byte
// elements), or as four 32-bit words of packed 1- or 2-byte elements (gpu::WordFold).
template <class F, bool kPacked = (sizeof(typename F::S) < 4)>
struct PackFold {
  using Pk = gpu::Pack<typename F::S>;
  __device__ __forceinline__ static void fold(Pk& acc, const Pk& v, const F& f) {
    COMMLIB_UNROLL
    for (int j = 0; j < Pk::kN; ++j) acc.v[j] = f(acc.v[j], v.v[j]);
  }
};
template <class F>
struct PackFold<F, true> {
  using Pk = gpu::Pack<uint32_t>;
  __device__ __forceinline__ static void fold(Pk& acc, const Pk& v, const F& f) {
    const gpu::WordFold<F> w{f};
    COMMLIB_UNROLL
    for (int j = 0; j < Pk::kN; ++j) acc.v[j] = w(acc.v[j], v.v[j]);
  }
};

// Packs i, i + stride, ..., i + (W - 1) strides of every rank, folded in rank order, stored into
// every rank (reduce_from_all: this rank); with kTail, only those below npacks (predicated: the
// tail keeps its loads in flight too).
template <unsigned W, bool kTail, class F>
__device__ __forceinline__ void fold_packs(const PlanLaunch& a, const kplan::PlanItem& it, uint64_t lo, size_t i,
                                           size_t stride, size_t npacks, const F& f) {
  using Pk = typename PackFold<F>::Pk;
  Pk acc[W];
  {
    const Pk* s = reinterpret_cast<const Pk*>(rank_buffer(a, 0, it.src_buf) + it.src_off + lo);
    COMMLIB_UNROLL
    for (unsigned u = 0; u < W; ++u)
      if (!kTail || i + u * stride < npacks) acc[u] = data_load(s + i + u * stride);
  }
  for (int q = 1; q < a.size; ++q) {
    const Pk* s = reinterpret_cast<const Pk*>(rank_buffer(a, q, it.src_buf) + it.src_off + lo);
    Pk v[W];
    COMMLIB_UNROLL
    for (unsigned u = 0; u < W; ++u)
      if (!kTail || i + u * stride < npacks) v[u] = data_load(s + i + u * stride);
    COMMLIB_UNROLL
    for (unsigned u = 0; u < W; ++u)
      if (!kTail || i + u * stride < npacks) PackFold<F>::fold(acc[u], v[u], f);
  }
  const bool everywhere = it.kind == kplan::kReduceToAll;
  for (int q = everywhere ? 0 : a.rank; q < (everywhere ? a.size : a.rank + 1); ++q) {
    Pk* d = reinterpret_cast<Pk*>(rank_buffer(a, q, it.dst_buf) + it.dst_off + lo);
    COMMLIB_UNROLL
    for (unsigned u = 0; u < W; ++u)
      if (!kTail || i + u * stride < npacks) data_store(d + i + u * stride, acc[u]);
  }
}

// One thread's part of the block's share [lo, lo + n) of item `it` (blockDim.x threads).
template <class F>
__device__ __forceinline__ void reduce_to_all_lanes(const PlanLaunch& a, const kplan::PlanItem& it, uint64_t lo,
                                                    size_t n, const F& f) {
  using S = typename F::S;
  constexpr size_t kPerPack = 16 / sizeof(S);  // elements of a 16-byte pack
  const bool everywhere = it.kind == kplan::kReduceToAll;
  uintptr_t bits = n;
  for (int q = 0; q < a.size; ++q) {
    bits |= reinterpret_cast<uintptr_t>(rank_buffer(a, q, it.src_buf) + it.src_off + lo);
    if (everywhere || q == a.rank) bits |= reinterpret_cast<uintptr_t>(rank_buffer(a, q, it.dst_buf) + it.dst_off + lo);
  }
  constexpr unsigned W = kUnroll / 2;
  const size_t elems = n / sizeof(S), stride = blockDim.x;
  size_t done = 0;
  if (bits % 16 == 0) {
    const size_t npacks = elems / kPerPack;
    size_t i = threadIdx.x;
    for (; i + (W - 1) * stride < npacks; i += W * stride) fold_packs<W, false, F>(a, it, lo, i, stride, npacks, f);
    if (i < npacks) fold_packs<W, true, F>(a, it, lo, i, stride, npacks, f);  // the tail, predicated
    done = npacks * kPerPack;
  }
  for (size_t i = done + threadIdx.x; i < elems; i += stride) {  // unaligned: element by element
    S acc = gpu::load_any<S>(rank_buffer(a, 0, it.src_buf) + it.src_off + lo, i);
    for (int q = 1; q < a.size; ++q) acc = f(acc, gpu::load_any<S>(rank_buffer(a, q, it.src_buf) + it.src_off + lo, i));
    for (int q = everywhere ? 0 : a.rank; q < (everywhere ? a.size : a.rank + 1); ++q)
      gpu::store_any<S>(rank_buffer(a, q, it.dst_buf) + it.dst_off + lo, i, acc);
    data_bytes(a.size * sizeof(S), (everywhere ? a.size : 1) * sizeof(S));
  }
}

// The block's share [lo, lo + n) of a reduce_to_all item.
template <class F>
__device__ __forceinline__ void block_reduce_to_all(const PlanLaunch& a, const kplan::PlanItem& it, uint64_t lo,
                                                    uint64_t n, const F& f) {
  block_lanes([&] { reduce_to_all_lanes(a, it, lo, n, f); });
}

}  // namespace kexec
}  // namespace commlib
