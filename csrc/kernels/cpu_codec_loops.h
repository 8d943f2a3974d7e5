// Branch-free CPU loops of the fp8 and bf16 codecs and of stochastic rounding, int and fp8
// (cpu_codecs.cc's fast paths; docs/compression.md "Cost"). Plain C++ that gcc vectorises at the baseline's SSE2
// (no intrinsics, no -march; `-fopt-info-vec` on cpu_codecs.cc lists them). Each computes bit for
// bit what the functors of codecs.h compute (tests/kernels/test_codec_loops.py compares every codec x
// dtype x block size x rounding against the scalar reference): where a block holds NaN/Inf, or
// its top code could pass the storage dtype's largest value, the caller runs the functors instead.
// Included by cpu_codecs.cc and cpu_error_feedback.cc only.
#pragma once

#include <cstddef>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/codecs.h"
#include "kernels/reduce_ops.h"

namespace commlib {
namespace loops {

using kern::DTypeTraits;
using kern::f32_bits;
using kern::f32_from_bits;
using kern::f64_bits;
using kern::f64_from_bits;

constexpr float kRoundMagic = 12582912.0f;           // 1.5 * 2^23: (y + it) - it = rint(y), |y| < 2^22
constexpr double kRoundMagic64 = 6755399441055744.0;  // 1.5 * 2^52: the same in double, |y| < 2^51

// All-ones where `c` holds (selects by masks: gcc's if-conversion leaves ?: on floats alone).
inline uint32_t mask32(bool c) { return 0u - static_cast<uint32_t>(c); }
inline uint32_t select32(bool c, uint32_t a, uint32_t b) { return (a & mask32(c)) | (b & ~mask32(c)); }

// Stochastic rounding's draw (codecs.h's sr_draw), spelled with the same integer steps so the
// loop vectorises: (seed + bits * C2) + (counter + 1) * C1, splitmix64's finaliser, 24 bits.
inline double sr_draw(uint64_t seed, uint64_t counter, float x) {
  uint64_t z = seed + static_cast<uint64_t>(f32_bits(x)) * 0xD1B54A32D192ED03ull + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(static_cast<int32_t>(z >> 40)) * (1.0 / 16777216.0);  // < 2^24: an int32
}

// floor(t) as an int32 for |t| < 2^31 without a libm call (SSE2 has no floor): r = rint(t) by the
// magic, minus one where it rounded up, read off the sign bit of t - r (exact: r is t's rounding),
// so no double compare (gcc does not vectorise its select into int32 lanes).
inline int32_t floor_to_int(double t) {
  const double r = (t + kRoundMagic64) - kRoundMagic64;
  return static_cast<int32_t>(r) - static_cast<int32_t>(f64_bits(t - r) >> 63);
}

// float32's common case, a block with no NaN/Inf: the largest |x| as the largest of the bit
// patterns x & 0x7fffffff (non-negative floats order as their bits; NaN and Inf are above every
// finite one), an integer max over 8 lanes that SSE2 does in about half the instructions of the
// float loop below. False (and *amax untouched) when the block holds NaN or Inf.
COMMLIB_FORCEINLINE bool finite_block_amax_bits(const float* x, size_t n, float* amax) {
  constexpr size_t kLanes = 8;
  int32_t m[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      int32_t b;
      std::memcpy(&b, x + i + j, sizeof b);
      b &= 0x7fffffff;
      m[j] = b > m[j] ? b : m[j];
    }
  int32_t top = 0;
  for (size_t j = 0; j < kLanes; ++j) top = m[j] > top ? m[j] : top;
  for (; i < n; ++i) {
    int32_t b;
    std::memcpy(&b, x + i, sizeof b);
    b &= 0x7fffffff;
    top = b > top ? b : top;
  }
  if (top >= 0x7f800000) return false;
  std::memcpy(amax, &top, sizeof top);
  return true;
}

// kern::block_scale_exp<G, D>(amax, nearest) of an integer grid (top = 2^K - 1) in closed form,
// for a finite amax >= 0: the functor tries exponents with a double division each (2-3 a block,
// a third of error feedback's time at block 32). With a = (1 + m / 2^23) 2^f, a / 2^(f - K + 1)
// lies in [2^(K-1), 2^K): it is over top exactly when m > 2^23 - 2^(24-K) (stochastic: amax
// itself is judged), and rounds (nearest-even) over top exactly when it is >= top + 1/2, i.e.
// m >= 2^23 - 2^(23-K); one exponent more always fits (below 2^(K-1)). A float32 subnormal or
// zero amax reads as f = -127 and lands under every dtype's smallest exponent, as the functor's
// does. Equal to the functor for every finite float (checked over all 2^31 of them, RESULTS
// session 20; tests/kernels/test_codec_loops.py holds the loops to the functors at the thresholds).
template <class G, DType D>
COMMLIB_FORCEINLINE int int_scale_exp(float amax, bool nearest) {
  constexpr int K = __builtin_ctz(static_cast<unsigned>(G::top) + 1u);
  static_assert(G::top == static_cast<double>((1 << K) - 1), "an integer grid: top = 2^K - 1");
  const uint32_t b = f32_bits(amax) & 0x7fffffffu;
  const uint32_t m = b & 0x7fffffu;
  const int f = static_cast<int>(b >> 23) - 127;
  const int over = nearest ? static_cast<int>(m >= (1u << 23) - (1u << (23 - K)))
                           : static_cast<int>(m > (1u << 23) - (1u << (24 - K)));
  const int e = f - (K - 1) + over;
  const int lo = kern::min_scale_exp<G, D>();
  return e < lo ? lo : e;
}

// A block's largest finite magnitude over 8 lanes (a reduction gcc vectorises); *finite: no NaN/Inf.
template <DType D>
COMMLIB_FORCEINLINE float block_amax(const typename DTypeTraits<D>::storage* x, size_t n, bool* finite) {
  using Tr = DTypeTraits<D>;
  if constexpr (D == DType::Float32) {
    float amax;
    if (finite_block_amax_bits(x, n, &amax)) {
      *finite = true;
      return amax;
    }
  }
  constexpr size_t kLanes = 8;
  float m[kLanes] = {}, bad[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      const float a = std::fabs(static_cast<float>(Tr::load(x[i + j])));
      const bool ok = a <= 3.4028234663852886e38f;  // false for NaN and Inf
      m[j] = (ok && a > m[j]) ? a : m[j];
      bad[j] = ok ? bad[j] : 1.0f;
    }
  float amax = 0, any_bad = 0;
  for (size_t j = 0; j < kLanes; ++j) {
    amax = m[j] > amax ? m[j] : amax;
    any_bad += bad[j];
  }
  for (; i < n; ++i) {
    const float a = std::fabs(static_cast<float>(Tr::load(x[i])));
    const bool ok = a <= 3.4028234663852886e38f;
    amax = (ok && a > amax) ? a : amax;
    any_bad += ok ? 0.0f : 1.0f;
  }
  *finite = any_bad == 0;
  return amax;
}

// fp8 codes of one finite block at scale 2^e, nearest-even. y = x * 2^-e is exact in float
// wherever it is normal (a power of two's product), and a y below 2^-126 rounds to code 0 either
// way. At or above the grid's smallest normal, RNE on the float's mantissa bits (the carry lands
// in the exponent, the next binade: the correct rounding); below it, multiples of
// 2^quantum_exp by the magic (2^M there, the smallest normal's code, comes out right too).
template <class G, DType D>
void fp8_codes(const typename DTypeTraits<D>::storage* x, size_t n, int e, uint8_t* codes) {
  using Tr = DTypeTraits<D>;
  constexpr int M = G::emin - G::quantum_exp;  // mantissa bits
  constexpr int BIAS = 1 - G::emin;
  constexpr uint32_t kShift = 23 - M;
  const float inv = static_cast<float>(kern::pow2(-e));  // e >= -127: a float
  const uint32_t emin_bits = f32_bits(static_cast<float>(kern::pow2(G::emin)));
  const float sub_scale = static_cast<float>(kern::pow2(-G::quantum_exp));
  const uint32_t magic_bits = f32_bits(kRoundMagic);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t yb = f32_bits(static_cast<float>(Tr::load(x[i])) * inv);
    const uint32_t ab = yb & 0x7fffffffu;
    const uint32_t r = ab + ((1u << (kShift - 1)) - 1u) + ((ab >> kShift) & 1u);
    const uint32_t normal = (r >> kShift) - (static_cast<uint32_t>(127 - BIAS) << M);
    const uint32_t sub = f32_bits(f32_from_bits(ab) * sub_scale + kRoundMagic) - magic_bits;
    const uint32_t mag = select32(ab < emin_bits, sub, normal);  // non-negative floats order like their bits
    codes[i] = static_cast<uint8_t>(mag | ((yb >> 24) & 0x80u & mask32(mag != 0)));  // zeros: +0
  }
}

// fp8 codes of one finite block at scale 2^e under stochastic rounding, as the functor rounds: y =
// x / 2^e (exact in double), its grid step 2^(ex - M) with ex = max(floor_log2|y|, emin), f =
// floor(y / step + u). Then |f| * step is the rounded value, and its code is ((ex + BIAS - 1) << M)
// + |f| whatever the binade: below emin |f| is the code itself (subnormal, or the smallest normal
// at |f| = 2^M), above it |f| in [2^M, 2^(M+1)] (2^(M+1): the carry into the next binade, its
// mantissa 0); f = 0 codes +0. The block's scale keeps |y| <= top, so the code never passes it.
template <class G, DType D>
void fp8_codes_stochastic(const typename DTypeTraits<D>::storage* x, size_t n, int e, uint64_t seed, uint64_t counter,
                          uint8_t* codes) {
  using Tr = DTypeTraits<D>;
  constexpr int64_t M = G::emin - G::quantum_exp;
  constexpr int64_t BIAS = 1 - G::emin;
  const double inv = kern::pow2(-e);
  for (size_t i = 0; i < n; ++i) {
    const float xi = static_cast<float>(Tr::load(x[i]));
    const double y = static_cast<double>(xi) * inv;
    const int64_t exa = static_cast<int64_t>((f64_bits(y) >> 52) & 0x7ff) - 1023;  // y = 0: -1023
    const int64_t d = exa - G::emin;
    const int64_t ex = exa - (d & (d >> 63));                                        // max(exa, emin)
    const double step_inv = f64_from_bits(static_cast<uint64_t>(1023 + M - ex) << 52);
    const int32_t f = floor_to_int(y * step_inv + sr_draw(seed, counter + i, xi));
    const int32_t neg = f >> 31, af = (f ^ neg) - neg;
    const int32_t mag = static_cast<int32_t>((ex + BIAS - 1) << M) + af;
    codes[i] = static_cast<uint8_t>(select32(af == 0, 0u, static_cast<uint32_t>(mag)) | (static_cast<uint32_t>(neg) & 0x80u));
  }
}

// fp8 decode of one block at scale 2^e: the code's value built from its bits (subnormals as
// mant * 2^quantum_exp), times 2^e in float (correctly rounded from the exact product, as the
// functor's double product cast to float is), NaN canonical, e5m2's Inf kept.
template <class G, DType D>
void fp8_decode_block(const uint8_t* codes, size_t n, int e, typename DTypeTraits<D>::storage* y) {
  using Tr = DTypeTraits<D>;
  constexpr int M = G::emin - G::quantum_exp;
  constexpr int BIAS = 1 - G::emin;
  constexpr uint32_t kExpAll = (1u << (7 - M)) - 1u;  // all-ones exponent
  constexpr bool kHasInf = G::nan_code == 0x7e;
  const float scale = static_cast<float>(kern::pow2(e));
  const float quantum = static_cast<float>(kern::pow2(G::quantum_exp));
  for (size_t i = 0; i < n; ++i) {
    const uint32_t c = codes[i];
    const uint32_t ex = (c >> M) & kExpAll, mant = c & ((1u << M) - 1u);
    const float normal = f32_from_bits(((ex + 127u - BIAS) << 23) | (mant << (23 - M)));
    const float sub = static_cast<float>(static_cast<int32_t>(mant)) * quantum;
    const uint32_t sign = (c & 0x80u) << 24;
    const float v = f32_from_bits(select32(ex == 0, f32_bits(sub), f32_bits(normal)));
    uint32_t bits = f32_bits(v * scale) | sign;
    const bool top_exp = ex == kExpAll;
    const bool nan = kHasInf ? (top_exp & (mant != 0)) : (top_exp & (mant == (1u << M) - 1u));
    if (kHasInf) bits = select32(top_exp & (mant == 0), sign | 0x7f800000u, bits);
    bits = select32(nan, kern::kF32CanonicalNaN, bits);
    y[i] = Tr::store(f32_from_bits(bits));
  }
}

// Integer codes of one finite block at scale 2^e under stochastic rounding: floor(y + u) in
// double, y = x / 2^e (exact in double), as the functor rounds.
template <class G, DType D>
void int_codes_stochastic(const typename DTypeTraits<D>::storage* x, size_t n, int e, uint64_t seed, uint64_t counter,
                          int8_t* codes) {
  using Tr = DTypeTraits<D>;
  const double inv = kern::pow2(-e);
  int32_t wide[256];  // (gcc vectorises the double lanes into int32, not straight into int8)
  for (size_t i0 = 0; i0 < n; i0 += 256) {
    const size_t m = n - i0 < 256 ? n - i0 : 256;
    for (size_t i = 0; i < m; ++i) {
      const float xi = static_cast<float>(Tr::load(x[i0 + i]));
      const double t = static_cast<double>(xi) * inv + sr_draw(seed, counter + i0 + i, xi);
      wide[i] = floor_to_int(t);
    }
    for (size_t i = 0; i < m; ++i) codes[i0 + i] = static_cast<int8_t>(wide[i]);
  }
}

// The largest bfloat16 pattern (magnitude) whose value is at most D's largest finite value: a
// rounded result above it steps one down (codecs.h's bf16_encode).
template <DType D>
uint32_t bf16_limit() {
  return f32_bits(static_cast<float>(kern::StorageLimits<D>::max)) >> 16;  // truncation rounds down
}

// bf16 encode, nearest-even (the rounding of float_to_bf16) or stochastic (the draw's top 16
// bits added to the magnitude, clamped at Inf); NaN to 0x7fc0, Inf kept, a finite value that
// rounded past D's largest steps one code toward zero.
template <DType D>
void bf16_encode_loop(const typename DTypeTraits<D>::storage* x, size_t n, bool stochastic, uint64_t seed,
                      uint64_t base, uint16_t* out) {
  using Tr = DTypeTraits<D>;
  const uint32_t limit = bf16_limit<D>();
  // The rounding (nearest or stochastic) in a loop of its own, then the special cases.
  if (stochastic) {
    for (size_t i = 0; i < n; ++i) {
      const float xi = static_cast<float>(Tr::load(x[i]));
      const uint32_t u = f32_bits(xi), sign = u & 0x80000000u;
      const uint32_t add = static_cast<uint32_t>(static_cast<int32_t>(sr_draw(seed, base + i, xi) * 65536.0));
      const uint32_t m = (u & 0x7fffffffu) + add;
      out[i] = static_cast<uint16_t>(select32(m >= 0x7f800000u, (sign >> 16) | 0x7f80u, (sign | m) >> 16));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = f32_bits(static_cast<float>(Tr::load(x[i])));
      out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = f32_bits(static_cast<float>(Tr::load(x[i]))), mag = u & 0x7fffffffu;
    uint32_t b = out[i];
    b = select32((mag < 0x7f800000u) & ((b & 0x7fffu) > limit), b - 1u, b);
    b = select32(mag == 0x7f800000u, u >> 16, b);  // ±Inf as float_to_bf16 gives it
    out[i] = static_cast<uint16_t>(select32(mag > 0x7f800000u, 0x7fc0u, b));
  }
}

// bf16 decode: the top half of a float32, NaN canonical.
template <DType D>
void bf16_decode_loop(const uint16_t* in, size_t n, typename DTypeTraits<D>::storage* y) {
  using Tr = DTypeTraits<D>;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    y[i] = Tr::store(f32_from_bits(select32((bits & 0x7fffffffu) > 0x7f800000u, kern::kF32CanonicalNaN, bits)));
  }
}

}  // namespace loops
}  // namespace commlib
