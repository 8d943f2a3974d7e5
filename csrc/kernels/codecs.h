// Block-wise quantization codecs (docs/compression.md), written once as __host__ __device__
// functors beside the reduction functors (reduce_ops.h) and run by the CPU loops of
// cpu_codecs.cc and by the device kernels of codec_kernel.h (CUDA and the emulated device), which
// the tests hold to the CPU's bytes and bits.
//
// A region of n elements of a floating dtype (float32, float16, bfloat16) encodes to
//   [one scale byte per block of `block` elements][payload: one code per element]
// (bf16 has no scales). A scale byte is a signed power-of-two exponent e: the block's elements
// are coded as y = x / 2^e on the codec's grid (integers for int8/int4, the fp8 values for
// e4m3/e5m2), with e the smallest exponent at which the block's largest finite magnitude fits
// the grid's top (127, 7, 448, 57344), but no smaller than the exponent below which a decoded
// value would not be exact in the storage dtype. Why powers of two: decode(encode(x)) is then a
// projection (decoding never rounds, and re-encoding a decoded block picks a scale at which every
// decoded value is again on the grid), so a partial sum that is forwarded and re-encoded comes
// back unchanged, and ranks that exchange encoded shards cannot drift apart.
//
// Rounding: nearest (ties to even) or stochastic, floor(y + u) with u from a counter-based hash
// of (seed, element index, the element's bits), so every rank can reproduce it. Non-finite input: int8, int4 and
// e4m3 code NaN and ±Inf as NaN (their grids have no Inf); e5m2 and bf16 keep ±Inf; the block's
// scale comes from its finite values only. A decoded value never exceeds the storage dtype's
// largest finite value (a code that would round past it steps one grid point toward zero).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/types.h"
#include "kernels/codec_spec.h"
#include "kernels/float_bits.h"
#include "kernels/reduce_ops.h"

namespace commlib {
namespace kern {

// 2^k as a double (k in the double's normal range, which every use here stays inside).
COMMLIB_HDI double pow2(int k) { return f64_from_bits(static_cast<uint64_t>(k + 1023) << 52); }
// floor(log2(a)) of a normal positive double.
COMMLIB_HDI int floor_log2(double a) { return static_cast<int>((f64_bits(a) >> 52) & 0x7ff) - 1023; }

// Uniform in [0, 1) with 24 bits, from (seed, counter): the splitmix64 finaliser of a Weyl step.
COMMLIB_HDI double sr_uniform(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 40) * (1.0 / 16777216.0);
}

// Stochastic rounding's draw for element x at `counter`: the value's bits join the stream, so
// ranks that round one value at one position of a region draw alike wherever the region lies.
COMMLIB_HDI double sr_draw(uint64_t seed, uint64_t counter, float x) {
  return sr_uniform(seed + static_cast<uint64_t>(f32_bits(x)) * 0xD1B54A32D192ED03ull, counter);
}

// Rounds y onto the integer grid: nearest-even (u < 0) or floor(y + u).
COMMLIB_HDI double round_grid(double y, double u) { return u < 0 ? rint(y) : floor(y + u); }

// Storage dtypes a codec takes: the largest finite value and the exponent of the smallest
// subnormal (every value of the dtype is a multiple of 2^quantum_exp).
template <DType D>
struct StorageLimits;
template <>
struct StorageLimits<DType::Float32> {
  static constexpr double max = 3.4028234663852886e38;
  static constexpr int quantum_exp = -149;
};
template <>
struct StorageLimits<DType::Float16> {
  static constexpr double max = 65504.0;
  static constexpr int quantum_exp = -24;
};
template <>
struct StorageLimits<DType::BFloat16> {
  static constexpr double max = 3.3895313892515355e38;
  static constexpr int quantum_exp = -133;
};

// Integer grid of BITS bits, symmetric [-top, top]; the one code left over (-2^(BITS-1)) is NaN.
template <int BITS>
struct IntGrid {
  static constexpr double top = static_cast<double>((1 << (BITS - 1)) - 1);
  static constexpr int quantum_exp = 0;
  static constexpr uint8_t mask = static_cast<uint8_t>((1u << BITS) - 1u);
  static constexpr uint8_t nan_code = static_cast<uint8_t>(1u << (BITS - 1));
  static COMMLIB_HDI double round_value(double y, double u) { return round_grid(y, u); }
  static COMMLIB_HDI uint8_t encode(double y, double u) {
    return static_cast<uint8_t>(static_cast<int>(round_grid(y, u)) & mask);
  }
  static COMMLIB_HDI uint8_t nonfinite(float) { return nan_code; }
  static COMMLIB_HDI bool is_nan(uint8_t c) { return c == nan_code; }
  static COMMLIB_HDI double decode(uint8_t c) {  // not NaN
    const int v = static_cast<int>(c & mask);
    return static_cast<double>(v >= (1 << (BITS - 1)) ? v - (1 << BITS) : v);
  }
  static COMMLIB_HDI uint8_t toward_zero(uint8_t c) {
    const double v = decode(c);
    return static_cast<uint8_t>(static_cast<int>(v > 0 ? v - 1 : v + 1) & mask);
  }
};

// An OCP fp8 grid: E exponent bits, M mantissa bits, bias; e4m3 has no Inf (0x7f is NaN), e5m2
// has IEEE-like Inf and NaN.
template <int E, int M, int BIAS, bool HAS_INF>
struct Fp8Grid {
  static constexpr int emin = 1 - BIAS;  // exponent of the smallest normal
  static constexpr int quantum_exp = emin - M;
  static constexpr double top = HAS_INF ? 57344.0 : 448.0;
  static constexpr uint8_t nan_code = HAS_INF ? 0x7e : 0x7f;
  // y rounded onto the grid (extended past top with the same spacing).
  static COMMLIB_HDI double round_value(double y, double u) {
    const double a = fabs(y);
    const int ex = a >= pow2(emin) ? floor_log2(a) : emin;
    const double step = pow2(ex - M);
    return round_grid(y / step, u) * step;
  }
  static COMMLIB_HDI uint8_t encode(double y, double u) {
    const double v = fabs(round_value(y, u));  // the scale keeps this <= top
    if (v == 0) return 0;  // zeros (and what rounds to zero) decode as +0
    const uint8_t sign = y < 0 ? 0x80 : 0;
    if (v < pow2(emin)) return static_cast<uint8_t>(sign | static_cast<uint8_t>(v / pow2(quantum_exp)));
    const int ev = floor_log2(v);
    const int mant = static_cast<int>(v / pow2(ev - M)) - (1 << M);
    return static_cast<uint8_t>(sign | ((ev + BIAS) << M) | mant);
  }
  static COMMLIB_HDI uint8_t nonfinite(float x) {
    if (HAS_INF && x == x) return static_cast<uint8_t>((x < 0 ? 0x80 : 0) | (((1 << E) - 1) << M));
    return nan_code;
  }
  static COMMLIB_HDI bool is_nan(uint8_t c) {
    if (HAS_INF) return ((c >> M) & ((1 << E) - 1)) == (1 << E) - 1 && (c & ((1 << M) - 1)) != 0;
    return (c & 0x7f) == 0x7f;
  }
  static COMMLIB_HDI double decode(uint8_t c) {  // not NaN
    const int ex = (c >> M) & ((1 << E) - 1);
    const int mant = c & ((1 << M) - 1);
    double v;
    if (HAS_INF && ex == (1 << E) - 1)
      v = static_cast<double>(INFINITY);
    else
      v = ex == 0 ? mant * pow2(quantum_exp) : ((1 << M) + mant) * pow2(ex - BIAS - M);
    return (c & 0x80) ? -v : v;
  }
  // fp8 magnitudes are ordered like their bit patterns: one code down is one grid point down.
  static COMMLIB_HDI uint8_t toward_zero(uint8_t c) {
    return (c & 0x7f) ? static_cast<uint8_t>(c - 1) : c;
  }
};

using Int8Grid = IntGrid<8>;
using Int4Grid = IntGrid<4>;
using E4M3Grid = Fp8Grid<4, 3, 7, false>;
using E5M2Grid = Fp8Grid<5, 2, 15, true>;

// The smallest scale exponent of grid G on storage dtype D: below it a decoded value would need
// bits finer than D's smallest subnormal. Never below -127 (a scale byte holds -128..127).
template <class G, DType D>
COMMLIB_HDI int min_scale_exp() {
  const int e = StorageLimits<D>::quantum_exp - G::quantum_exp;
  return e < -127 ? -127 : e;
}

// The scale exponent of a block whose largest finite magnitude is amax (0: all zero/non-finite):
// the smallest at which amax, rounded onto the grid, is at most top. Nearest rounding judges amax
// as it rounds, which makes encode idempotent bit for bit (re-encoding a decoded block picks the
// same exponent: docs/compression.md); stochastic rounding may round amax up, so it judges amax
// itself, and re-encoding may pick a smaller exponent that decodes to the same values.
template <class G, DType D>
COMMLIB_HDI int block_scale_exp(float amax, bool nearest) {
  const int lo = min_scale_exp<G, D>();
  if (!(amax > 0.0f)) return lo;
  const double a = static_cast<double>(amax);
  int e = floor_log2(a) - floor_log2(G::top) - 1;  // a / 2^e >= 2^(floor_log2(top) + 1) > top
  while ((nearest ? G::round_value(a / pow2(e), -1.0) : a / pow2(e)) > G::top) ++e;
  return e < lo ? lo : e;
}

// One element of a block at scale exponent e: its code.
template <class G, DType D>
COMMLIB_HDI uint8_t encode_element(float x, int e, double u) {
  if (!(x - x == 0.0f)) return G::nonfinite(x);  // NaN or ±Inf
  uint8_t c = G::encode(static_cast<double>(x) / pow2(e), u);
  if (fabs(G::decode(c)) * pow2(e) > StorageLimits<D>::max) c = G::toward_zero(c);
  return c;
}

// A code at scale exponent e, as the storage dtype's compute value (exact; NaN canonical).
template <class G>
COMMLIB_HDI float decode_element(uint8_t c, int e) {
  if (G::is_nan(c)) return f32_from_bits(kF32CanonicalNaN);
  return static_cast<float>(G::decode(c) * pow2(e));
}

// bf16 codec (no scale): round to bfloat16, nearest-even or stochastic (16 random low bits added
// before truncation); ±Inf kept, NaN canonical; a finite value never becomes larger than D's max.
template <DType D>
COMMLIB_HDI uint16_t bf16_encode(float x, double u) {
  if (x != x) return 0x7fc0;
  if (x - x != 0.0f) return float_to_bf16(x);  // ±Inf
  uint16_t b;
  if (u < 0) {
    b = float_to_bf16(x);
  } else {
    const uint32_t bits = f32_bits(x);
    const uint32_t add = static_cast<uint32_t>(u * 65536.0);
    const uint32_t mag = (bits & 0x7fffffffu) + add;  // may carry into Inf: clamped below
    b = static_cast<uint16_t>(((bits & 0x80000000u) | (mag & 0x7fffffffu)) >> 16);
    if (mag >= 0x7f800000u) b = static_cast<uint16_t>((bits >> 16) & 0x8000u) | 0x7f80u;
  }
  if (fabs(static_cast<double>(bf16_to_float(b))) > StorageLimits<D>::max) b = static_cast<uint16_t>(b - 1);
  return b;
}

COMMLIB_HDI float bf16_decode(uint16_t b) { return canon(bf16_to_float(b)); }

}  // namespace kern
}  // namespace commlib
