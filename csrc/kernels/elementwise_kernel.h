// The elementwise reduction kernel (dst = f(dst, src)), its element functors and its launch
// shape, shared by the CUDA launcher (cuda_reduce.cu, <<<>>> on a stream) and the emulated device
// (device/emulated/emulated_kernels.cc, through cuda_shim.h on the host): CI runs the GPU's kernel body.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda_shim.h"
#include "kernels/reduce_ops.h"

namespace commlib {
namespace gpu {

using kern::DTypeTraits;

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;  // grid-stride beyond this

enum Access : int { kVector = 0, kElement = 1, kBytes = 2 };

template <typename S>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(S);
  S v[kN];
};

// Elementwise bodies: out = f(dst_value, src_value) on storage values.
template <DType D, class Op>
struct ReduceElem {
  using Tr = DTypeTraits<D>;
  using S = typename Tr::storage;
  static constexpr bool kReadsDst = true;
  __device__ __forceinline__ S operator()(S a, S b) const { return Tr::store(Op{}(Tr::load(a), Tr::load(b))); }
};

template <DType D>
struct ScaleElem {
  using Tr = DTypeTraits<D>;
  using S = typename Tr::storage;
  static constexpr bool kReadsDst = false;
  kern::Scale<typename Tr::compute> op;
  __device__ __forceinline__ S operator()(S, S b) const { return Tr::store(op(Tr::load(b))); }
};

template <DType D>
struct DivideElem {
  using Tr = DTypeTraits<D>;
  using S = typename Tr::storage;
  static constexpr bool kReadsDst = true;
  kern::Divide<typename Tr::compute> op;
  __device__ __forceinline__ S operator()(S a, S) const { return Tr::store(op(Tr::load(a))); }
};

// A byte copy as an elementwise body: the copy path's gated copies (cuda_reduce.cu), which must be
// kernels to read their stop word.
struct CopyElem {
  using S = unsigned char;
  static constexpr bool kReadsDst = false;
  __device__ __forceinline__ S operator()(S, S b) const { return b; }
};

// f over the elements packed in 32-bit words (elements of 1 or 2 bytes: 4 / sizeof(S) per word,
// element k at bits 8 sizeof(S) k, as little-endian memory lays them out): each element is
// unpacked only while f runs on it, so the same results as f element by element, bit for bit, with
// a 16-byte pack held in 4 registers rather than one per element (the fused kernels' accumulators,
// plan_reduce_to_all.cuh). Like ReduceElem, plain C++ off the GPU: the emulated device runs it.
template <class F>
struct WordFold {
  using S = typename F::S;
  static_assert(sizeof(S) == 1 || sizeof(S) == 2, "packed words hold 1- or 2-byte elements");
  using U = std::conditional_t<sizeof(S) == 1, uint8_t, uint16_t>;
  static constexpr int kPerWord = 4 / sizeof(S);
  F f;
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const {
    uint32_t out = 0;
    COMMLIB_UNROLL
    for (int k = 0; k < kPerWord; ++k) {
      const unsigned shift = 8 * sizeof(S) * k;
      S x, y;
      const U ux = static_cast<U>(a >> shift), uy = static_cast<U>(b >> shift);
      memcpy(&x, &ux, sizeof(S));
      memcpy(&y, &uy, sizeof(S));
      const S r = f(x, y);
      U ur;
      memcpy(&ur, &r, sizeof(S));
      out |= static_cast<uint32_t>(ur) << shift;
    }
    return out;
  }
};

template <typename S>
__device__ __forceinline__ S load_any(const void* p, size_t i) {
  S x;
  memcpy(&x, static_cast<const unsigned char*>(p) + i * sizeof(S), sizeof(S));
  return x;
}
template <typename S>
__device__ __forceinline__ void store_any(void* p, size_t i, S x) {
  memcpy(static_cast<unsigned char*>(p) + i * sizeof(S), &x, sizeof(S));
}

// One thread's share of dst[i] = f(dst[i], src[i]); src may equal dst (divide passes dst as src).
template <class F, int kAccess>
__device__ __forceinline__ void elementwise_body(void* dst, const void* src, size_t n, const F& f) {
  using S = typename F::S;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t done = 0;
  if constexpr (kAccess == kVector) {
    using P = Pack<S>;
    P* d = static_cast<P*>(dst);
    const P* s = static_cast<const P*>(src);
    const size_t npacks = n / P::kN;
    for (size_t i = tid; i < npacks; i += stride) {
      P a{};
      if constexpr (F::kReadsDst) a = d[i];
      const P b = s[i];
      COMMLIB_UNROLL
      for (int j = 0; j < P::kN; ++j) a.v[j] = f(a.v[j], b.v[j]);
      d[i] = a;
    }
    done = npacks * P::kN;
  }
  if constexpr (kAccess == kBytes) {
    for (size_t i = tid; i < n; i += stride) {
      const S a = F::kReadsDst ? load_any<S>(dst, i) : S{};
      store_any<S>(dst, i, f(a, load_any<S>(src, i)));
    }
  } else {
    S* d = static_cast<S*>(dst);
    const S* s = static_cast<const S*>(src);
    for (size_t i = done + tid; i < n; i += stride) d[i] = f(F::kReadsDst ? d[i] : S{}, s[i]);
  }
}

// The grid a launch of `n` elements uses: access kind by alignment, one thread per 16-byte pack
// (vector) or element, capped at kMaxBlocks blocks.
struct LaunchShape {
  int access;
  unsigned blocks;
};

template <typename S>
inline LaunchShape launch_shape(const void* dst, const void* src, size_t n) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  const int access = bits % 16 == 0 ? kVector : (bits % sizeof(S) == 0 ? kElement : kBytes);
  const size_t work = access == kVector ? std::max<size_t>(n / Pack<S>::kN, n % Pack<S>::kN) : n;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((work + kThreads - 1) / kThreads, kMaxBlocks));
  return LaunchShape{access, blocks};
}

// Dispatch visitors (kern::dispatch_reduce / dispatch_dtype) that hand a launcher the element
// functor for a dtype and op: Launch is a struct with template <class F> void operator()(F f).
template <class Launch>
struct ReduceVisitor {
  Launch& launch;
  template <DType D, class Op>
  void reduce() {
    launch(ReduceElem<D, Op>{});
  }
};

template <class Launch>
struct ScaleVisitor {
  Launch& launch;
  double scale;
  template <DType D>
  void typed() {
    launch(ScaleElem<D>{kern::Scale<typename DTypeTraits<D>::compute>(scale)});
  }
};

template <class Launch>
struct DivideVisitor {
  Launch& launch;
  int64_t divisor;
  template <DType D>
  void typed() {
    launch(DivideElem<D>{kern::Divide<typename DTypeTraits<D>::compute>(divisor)});
  }
};

}  // namespace gpu
}  // namespace commlib
