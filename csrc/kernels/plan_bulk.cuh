// The kernel executor's bulk loops (plan_kernel.cuh): a block's threads copy or reduce a range,
// kUnroll loads in flight per thread; on the emulated device run as kEmuLanes virtual threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/elementwise_kernel.h"
#include "kernels/plan_atomics.cuh"

namespace commlib {
namespace kexec {

struct alignas(16) Vec16 {
  uint64_t lo, hi;
};

// Loads each thread keeps in flight in the bulk loops below. Why: one block moves a whole chunk,
// and a loop with one load per iteration waits out the memory latency per 16 bytes (a block then
// moved about 5 GB/s on an H100, bench/RESULTS_gpu.md); kUnroll independent loads before their
// stores hide it.
constexpr unsigned kUnroll = 8;

template <typename T>
__device__ __forceinline__ void copy_as(char* dst, const char* src, size_t n) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  const size_t count = n / sizeof(T), stride = blockDim.x;
  size_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * stride < count; i += kUnroll * stride) {
    T v[kUnroll];
    COMMLIB_UNROLL
    for (unsigned u = 0; u < kUnroll; ++u) v[u] = data_load(s + i + u * stride);
    COMMLIB_UNROLL
    for (unsigned u = 0; u < kUnroll; ++u) data_store(d + i + u * stride, v[u]);
  }
  for (; i < count; i += stride) data_store(d + i, data_load(s + i));
}

#ifndef __CUDACC__
constexpr unsigned kEmuLanes = 3;  // odd: strides, unrolled bodies and tails all get exercised
#endif

// Runs `body`, a loop over the block's threads with no barrier inside, as a block's threads would.
// On the emulated device a block is one host thread (its waits and barriers need that), so the
// body runs once per virtual thread of a kEmuLanes-wide block, in turn: CI then checks the
// strided indexing of the bulk loops, not only a one-thread block's.
template <class Body>
__device__ __forceinline__ void block_lanes(const Body& body) {
#ifdef __CUDACC__
  body();
#else
  if (blockDim.x != 1) {
    body();
    return;
  }
  const unsigned self = threadIdx.x;
  blockDim.x = kEmuLanes;
  for (unsigned lane = 0; lane < kEmuLanes; ++lane) {
    threadIdx.x = lane;
    body();
  }
  threadIdx.x = self;
  blockDim.x = 1;
#endif
}

// The block's threads copy n bytes (the widest access both pointers and n allow).
__device__ __forceinline__ void block_copy(char* dst, const char* src, size_t n) {
  if (dst == src || n == 0) return;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | n;
  block_lanes([&] {
    if (bits % 16 == 0)
      copy_as<Vec16>(dst, src, n);
    else if (bits % 8 == 0)
      copy_as<uint64_t>(dst, src, n);
    else if (bits % 4 == 0)
      copy_as<uint32_t>(dst, src, n);
    else
      copy_as<uint8_t>(dst, src, n);
  });
}

// The block's threads compute dst[i] = f(a[i], b[i]) for n elements (a may be dst).
template <class F>
__device__ __forceinline__ void block_reduce_lanes(char* dst, const char* a, const char* b, size_t n, const F& f) {
  using S = typename F::S;
  using P = gpu::Pack<S>;
  const uintptr_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b);
  size_t done = 0;
  if (bits % 16 == 0) {
    P* d = reinterpret_cast<P*>(dst);
    const P* x = reinterpret_cast<const P*>(a);
    const P* y = reinterpret_cast<const P*>(b);
    const size_t npacks = n / P::kN, stride = blockDim.x;
    constexpr unsigned U = kUnroll / 2;  // two loads per pack: as many in flight as a copy's
    size_t i = threadIdx.x;
    for (; i + (U - 1) * stride < npacks; i += U * stride) {
      P u[U], v[U];
      COMMLIB_UNROLL
      for (unsigned k = 0; k < U; ++k) {
        u[k] = data_load(x + i + k * stride);
        v[k] = data_load(y + i + k * stride);
      }
      COMMLIB_UNROLL
      for (unsigned k = 0; k < U; ++k) {
        COMMLIB_UNROLL
        for (int j = 0; j < P::kN; ++j) u[k].v[j] = f(u[k].v[j], v[k].v[j]);
        data_store(d + i + k * stride, u[k]);
      }
    }
    for (; i < npacks; i += stride) {
      P u = data_load(x + i);
      const P v = data_load(y + i);
      COMMLIB_UNROLL
      for (int j = 0; j < P::kN; ++j) u.v[j] = f(u.v[j], v.v[j]);
      data_store(d + i, u);
    }
    done = npacks * P::kN;
  }
  if (bits % sizeof(S) == 0) {
    S* d = reinterpret_cast<S*>(dst);
    const S* x = reinterpret_cast<const S*>(a);
    const S* y = reinterpret_cast<const S*>(b);
    for (size_t i = done + threadIdx.x; i < n; i += blockDim.x) data_store(d + i, f(data_load(x + i), data_load(y + i)));
  } else {
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
      gpu::store_any<S>(dst, i, f(gpu::load_any<S>(a, i), gpu::load_any<S>(b, i)));
      data_bytes(2 * sizeof(S), sizeof(S));
    }
  }
}

template <class F>
__device__ __forceinline__ void block_reduce(char* dst, const char* a, const char* b, size_t n, const F& f) {
  block_lanes([&] { block_reduce_lanes(dst, a, b, n, f); });
}

}  // namespace kexec
}  // namespace commlib
