// The integer grids' CPU loops (int8, int4): encode (with the sender's projection) and decode, each
// compiled twice, for the baseline's SSE2 and for AVX2 (docs/compression.md "Cost"). Included by
// cpu_codecs.cc only (its encode_int / decode_int).
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu_codec_loops.h"
#include "kernels/cpu_codecs.h"
#include "kernels/cpu_features.h"

namespace commlib {
namespace int_loops {

using kern::DTypeTraits;

// The integer grids (nearest; stochastic: cpu_codec_loops.h's draw), in loops gcc vectorises with the
// baseline's SSE2 (no intrinsics): per block, the finite amax over 8 lanes, then y = x * 2^-e in
// float and rint(y) by the 1.5 * 2^23 trick. Bit for bit what the functors compute: x * 2^-e is
// exact in float wherever |y| >= 2^-126 (a power of two's product), and below that both round to
// a zero code; the trick rounds to nearest-even for |y| < 2^22 (here |y| <= top + 1/2). A block
// holding a non-finite value, or whose top code at its scale would pass the dtype's largest value
// (codecs.h's step toward zero), goes through the functors instead.
using loops::block_amax;
using loops::kRoundMagic;

// Codes of one finite block at scale 2^e: one signed integer per byte.
template <DType D>
COMMLIB_FORCEINLINE void int_codes(const typename DTypeTraits<D>::storage* x, size_t n, int e, int8_t* codes) {
  using Tr = DTypeTraits<D>;
  const float inv = static_cast<float>(kern::pow2(-e));
  for (size_t i = 0; i < n; ++i) {
    const float y = static_cast<float>(Tr::load(x[i])) * inv;
    codes[i] = static_cast<int8_t>(static_cast<int>((y + kRoundMagic) - kRoundMagic));
  }
}

// `project` (float32, nearest only; may alias src): each fast block's decoded values, code * 2^e,
// written as soon as the block is coded; *all_projected says whether every block went so.
template <class G, DType D>
COMMLIB_FORCEINLINE bool encode_int_loops(const CodecSpec& spec, const void* src, size_t n, uint8_t* dst,
                                          uint64_t base, float* project, bool* all_projected) {
  using Tr = DTypeTraits<D>;
  const auto* x = static_cast<const typename Tr::storage*>(src);
  const size_t B = static_cast<size_t>(spec.block);
  constexpr bool kNibbles = std::is_same<G, kern::Int4Grid>::value;
  uint8_t* scales = dst;
  uint8_t* payload = dst + codec_scale_bytes(spec, n);
  // int4: codes of a stretch of whole blocks (an even number of elements) one per byte, then packed.
  int8_t stretch[4096];
  const size_t per = kNibbles ? std::max<size_t>(2 * B, sizeof(stretch) / (2 * B) * (2 * B)) : n;
  if (kNibbles && per > sizeof(stretch)) return false;  // huge blocks: the functors' loop
  for (size_t s0 = 0, blk = 0; s0 < n; s0 += per) {
    const size_t s1 = std::min(n, s0 + per);
    int8_t* codes = kNibbles ? stretch : reinterpret_cast<int8_t*>(payload) + s0;
    for (size_t b0 = s0; b0 < s1; b0 += B, ++blk) {
      const size_t b1 = std::min(b0 + B, n);
      bool finite;
      const float amax = block_amax<D>(x + b0, b1 - b0, &finite);
      const int e = loops::int_scale_exp<G, D>(amax, !spec.stochastic);
      scales[blk] = static_cast<uint8_t>(static_cast<int8_t>(e));
      int8_t* c = codes + (b0 - s0);
      if (finite && G::top * kern::pow2(e) <= kern::StorageLimits<D>::max) {
        if (spec.stochastic) {
          loops::int_codes_stochastic<G, D>(x + b0, b1 - b0, e, spec.seed, base + b0, c);
          if (project) *all_projected = false;
        } else {
          int_codes<D>(x + b0, b1 - b0, e, c);
          if (project) {  // the block is read: its decoded values may go where it was
            const float scale = static_cast<float>(kern::pow2(e));
            for (size_t i = b0; i < b1; ++i) project[i] = static_cast<float>(c[i - b0]) * scale;
          }
        }
      } else {
        if (project) *all_projected = false;
        for (size_t i = b0; i < b1; ++i) {
          const float xi = static_cast<float>(Tr::load(x[i]));
          const double u = spec.stochastic ? kern::sr_draw(spec.seed, base + i, xi) : -1.0;
          const uint8_t code = kern::encode_element<G, D>(xi, e, u);
          c[i - b0] = static_cast<int8_t>(kNibbles && (code & 8) ? code | 0xf0 : code);
        }
      }
    }
    if (kNibbles) {
      const size_t m = s1 - s0;
      uint8_t* out = payload + s0 / 2;
      for (size_t j = 0; j < m / 2; ++j)
        out[j] = static_cast<uint8_t>((stretch[2 * j] & 0xf) | ((stretch[2 * j + 1] & 0xf) << 4));
      if (m & 1) out[m / 2] = static_cast<uint8_t>(stretch[m - 1] & 0xf);
    }
  }
  return true;
}

// encode_int_loops once per instruction set (as cpu_error_feedback.cc's loops): AVX2 where the CPU
// reduction path is a vector one, SSE2 otherwise; the same bits either way (no FMA in the target).
template <class G, DType D>
bool encode_int_baseline(const CodecSpec& spec, const void* src, size_t n, uint8_t* dst, uint64_t base,
                         float* project, bool* all_projected) {
  return encode_int_loops<G, D>(spec, src, n, dst, base, project, all_projected);
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
template <class G, DType D>
__attribute__((target("avx2"))) bool encode_int_avx2(const CodecSpec& spec, const void* src, size_t n, uint8_t* dst,
                                                     uint64_t base, float* project, bool* all_projected) {
  return encode_int_loops<G, D>(spec, src, n, dst, base, project, all_projected);
}
inline bool vector_path() { return std::strcmp(cpu_reduce_path(), "baseline") != 0; }
#else
#define encode_int_avx2 encode_int_baseline
inline bool vector_path() { return false; }
#endif

template <class G, DType D>
bool encode_int(const CodecSpec& spec, const void* src, size_t n, uint8_t* dst, uint64_t base,
                float* project = nullptr, bool* all_projected = nullptr) {
  return vector_path() ? encode_int_avx2<G, D>(spec, src, n, dst, base, project, all_projected)
                       : encode_int_baseline<G, D>(spec, src, n, dst, base, project, all_projected);
}

// Decoding the integer grids: code * 2^e in float (exact: at most 7 significant bits, and 2^e is
// a float, subnormal at worst), NaN's code to the canonical NaN.
template <class G, DType D>
COMMLIB_FORCEINLINE void decode_int_loops(const CodecSpec& spec, const uint8_t* src, size_t n, void* dst) {
  using Tr = DTypeTraits<D>;
  auto* y = static_cast<typename Tr::storage*>(dst);
  const size_t B = static_cast<size_t>(spec.block);
  constexpr bool kNibbles = std::is_same<G, kern::Int4Grid>::value;
  const uint8_t* scales = src;
  const uint8_t* payload = src + codec_scale_bytes(spec, n);
  const float nan = kern::f32_from_bits(kern::kF32CanonicalNaN);
  int8_t stretch[4096];
  const size_t per = kNibbles ? sizeof(stretch) : n;
  for (size_t s0 = 0; s0 < n; s0 += per) {  // per is even: a stretch starts on a byte
    const size_t s1 = std::min(n, s0 + per);
    const int8_t* codes = reinterpret_cast<const int8_t*>(payload) + s0;
    if (kNibbles) {
      const uint8_t* in = payload + s0 / 2;
      for (size_t j = 0; j < (s1 - s0) / 2; ++j) {
        stretch[2 * j] = static_cast<int8_t>(static_cast<int8_t>(in[j] << 4) >> 4);
        stretch[2 * j + 1] = static_cast<int8_t>(static_cast<int8_t>(in[j]) >> 4);
      }
      if ((s1 - s0) & 1) stretch[s1 - s0 - 1] = static_cast<int8_t>(static_cast<int8_t>(in[(s1 - s0) / 2] << 4) >> 4);
      codes = stretch;
    }
    for (size_t b0 = s0 - s0 % B, blk = s0 / B; b0 < s1; b0 += B, ++blk) {
      const size_t lo = std::max(b0, s0), hi = std::min(b0 + B, s1);
      const float scale = static_cast<float>(kern::pow2(static_cast<int8_t>(scales[blk])));
      const int8_t nan_code = static_cast<int8_t>(kNibbles ? -8 : -128);
      if constexpr (D == DType::Float32) {  // a select on the bits: no branch, so gcc vectorises it
        const uint32_t nan_bits = kern::kF32CanonicalNaN;
        for (size_t i = lo; i < hi; ++i) {
          const int8_t c = codes[i - s0];
          const uint32_t is_nan = 0u - static_cast<uint32_t>(c == nan_code);
          const uint32_t bits = kern::f32_bits(static_cast<float>(c) * scale);
          y[i] = kern::f32_from_bits((bits & ~is_nan) | (nan_bits & is_nan));
        }
      } else {
        for (size_t i = lo; i < hi; ++i) {
          const int8_t c = codes[i - s0];
          const float v = static_cast<float>(c) * scale;
          y[i] = Tr::store(c == nan_code ? nan : v);
        }
      }
    }
  }
}

// decode_int_loops once per instruction set, as the encode (a multiply and a select: the same bits).
template <class G, DType D>
void decode_int_baseline(const CodecSpec& spec, const uint8_t* src, size_t n, void* dst) {
  decode_int_loops<G, D>(spec, src, n, dst);
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
template <class G, DType D>
__attribute__((target("avx2"))) void decode_int_avx2(const CodecSpec& spec, const uint8_t* src, size_t n, void* dst) {
  decode_int_loops<G, D>(spec, src, n, dst);
}
#else
#define decode_int_avx2 decode_int_baseline
#endif

template <class G, DType D>
void decode_int(const CodecSpec& spec, const uint8_t* src, size_t n, void* dst) {
  if (vector_path())
    decode_int_avx2<G, D>(spec, src, n, dst);
  else
    decode_int_baseline<G, D>(spec, src, n, dst);
}

}  // namespace int_loops
}  // namespace commlib
