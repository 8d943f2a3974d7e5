// Floating-point bit patterns, written once for host and device: bit casts, float16 and bfloat16
// to and from float32 (integer only, so no FMA contraction or FP flag can change a result; see
// reduce_ops.h for the numerics they serve) and NaN canonicalisation. Everything here is
// __host__ __device__ under nvcc and plain inline C++ otherwise.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define COMMLIB_HD __host__ __device__
#define COMMLIB_FORCEINLINE __forceinline__
#else
#define COMMLIB_HD
#define COMMLIB_FORCEINLINE inline __attribute__((always_inline))
#endif
#define COMMLIB_HDI COMMLIB_HD COMMLIB_FORCEINLINE

namespace commlib {
namespace kern {

// ---------------------------------------------------------------------------------------------
// Bit casts (memcpy is folded to a register move on host and device).
COMMLIB_HDI uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
COMMLIB_HDI float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
COMMLIB_HDI uint64_t f64_bits(double f) {
  uint64_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
COMMLIB_HDI double f64_from_bits(uint64_t u) {
  double f;
  memcpy(&f, &u, sizeof f);
  return f;
}

constexpr uint32_t kF32CanonicalNaN = 0x7fc00000u;
constexpr uint64_t kF64CanonicalNaN = 0x7ff8000000000000ull;

// ---------------------------------------------------------------------------------------------
// bfloat16 <-> float. bfloat16 is the top half of a float32.
COMMLIB_HDI float bf16_to_float(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

COMMLIB_HDI uint16_t float_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  // Round to nearest even on bit 16: add 0x7fff plus the lowest kept bit. Cannot carry out of a
  // finite value into anything but the next binade / Inf, which is the correct rounding.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;  // keep sign and payload top, force quiet
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// The same rounding for values whose NaNs are canonical (every functor result is): the plain
// round-to-nearest-even formula already maps 0x7fc00000 to 0x7fc0 (and Inf to Inf), so the NaN
// select is dropped, which roughly halves the vector work of a bfloat16 reduction.
COMMLIB_HDI uint16_t float_to_bf16_canonical(float f) {
  const uint32_t u = f32_bits(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------------------------
// IEEE binary16 <-> float, integer only (vectorises: shifts, adds and selects).
COMMLIB_HDI float half_to_float(uint16_t h) {
  const uint32_t x = h;
  const uint32_t sign = (x & 0x8000u) << 16;
  const uint32_t exp = (x >> 10) & 0x1fu;
  const uint32_t mant = x & 0x3ffu;
  // Normal: rebias the exponent (15 -> 127). Inf/NaN: all-ones exponent, payload kept, NaN
  // quieted (as vcvtph2ps does). Subnormal (mant * 2^-24): normalise mant by a branch-free binary
  // search for its top bit (shift left by k so that bit 10 is set; the exponent is 2^-14 / 2^k).
  // Integer selects only, so that it vectorises (a float conversion in one arm would be turned
  // into a branch under -ftrapping-math) and no FP flag or FMA contraction is involved.
  const uint32_t normal = ((exp + 112u) << 23) | (mant << 13);
  const uint32_t infnan = 0x7f800000u | (mant << 13) | (mant != 0u ? 0x00400000u : 0u);
  // (Normal inputs search 0x400, so that scalar code, where gcc may use branches, predicts them.)
  const uint32_t m0 = exp == 0u ? mant : 0x400u;
  uint32_t m = m0, k = 0;
  m = m < (1u << 3) ? m << 8 : m;
  k = m0 < (1u << 3) ? 8u : 0u;
  k = m < (1u << 7) ? k + 4u : k;
  m = m < (1u << 7) ? m << 4 : m;
  k = m < (1u << 9) ? k + 2u : k;
  m = m < (1u << 9) ? m << 2 : m;
  k = m < (1u << 10) ? k + 1u : k;
  m = m < (1u << 10) ? m << 1 : m;
  const uint32_t sub = mant != 0u ? ((113u - k) << 23) | ((m & 0x3ffu) << 13) : 0u;
  uint32_t mag = exp == 31u ? infnan : normal;
  mag = exp == 0u ? sub : mag;
  return f32_from_bits(sign | mag);
}

COMMLIB_HDI uint16_t float_to_half(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // NaN: quiet, keep the payload's top 10 bits (matches vcvtps2ph). Values that round to
  // >= 65520 (and Inf) become Inf.
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  // Normal range (a >= 2^-14): round to nearest even on bit 13, then rebias the exponent.
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - (112u << 23)) >> 13;
  // Subnormal range (a < 2^-14): the value in units of 2^-24 is m * 2^(e - 126) with the
  // implicit bit; shift right by s = 126 - e (14..25; anything smaller rounds to 0), round to
  // nearest even.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t s = (e - 101u) <= 11u ? 126u - e : 31u;
  const uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  const uint32_t up = static_cast<uint32_t>(rem > half) | (static_cast<uint32_t>(rem == half) & q);
  const uint32_t sub = q + (up & 1u);
  uint32_t mag = a >= 0x38800000u ? normal : sub;
  mag = a >= 0x477ff000u ? 0x7c00u : mag;
  mag = a > 0x7f800000u ? nan : mag;
  return static_cast<uint16_t>(sign | mag);
}

// On the GPU, float16 converts with the hardware's cvt instructions, one each way, where the
// integer forms above hold tens of temporaries (with them the fused kernels' packed float16
// accumulators spilled, plan_reduce_to_all.cuh). The bits are the same: every binary16 value is
// exact in float32 (cvt.f32.f16 rounds nothing), and cvt.rn.f16.f32 rounds to nearest even with
// subnormal results and overflow to infinity, as float_to_half does (no .ftz: a float32 subnormal
// rounds to a signed zero either way). NaNs alone take the integer forms' bits, since PTX leaves
// the payload of a converted NaN unspecified. tests/kernels/test_cuda.py (GPU only) compares the
// CUDA kernels' float16 results with the CPU's for every binary16 pattern and random pairs.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float half_to_float_hw(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  const uint32_t x = h;
  const uint32_t nan = ((x & 0x8000u) << 16) | 0x7fc00000u | ((x & 0x3ffu) << 13);
  return (x & 0x7fffu) > 0x7c00u ? f32_from_bits(nan) : f;
}
__device__ __forceinline__ uint16_t float_to_half_hw(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  const uint32_t u = f32_bits(f);
  const uint32_t nan = ((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu);
  return (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>(nan) : h;
}
#endif
// float16 as the functors load and store it (reduce_ops.h' DTypeTraits), chosen here once: the cvt
// forms in device code, the integer forms on the CPU (the same bits, above).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float half_load(uint16_t h) { return half_to_float_hw(h); }
__device__ __forceinline__ uint16_t half_store(float f) { return float_to_half_hw(f); }
#else
COMMLIB_FORCEINLINE float half_load(uint16_t h) { return half_to_float(h); }
COMMLIB_FORCEINLINE uint16_t half_store(float f) { return float_to_half(f); }
#endif

// ---------------------------------------------------------------------------------------------
// NaN canonicalisation and bit-level helpers for min/max.
COMMLIB_HDI float canon(float x) { return x != x ? f32_from_bits(kF32CanonicalNaN) : x; }
COMMLIB_HDI double canon(double x) { return x != x ? f64_from_bits(kF64CanonicalNaN) : x; }

}  // namespace kern
}  // namespace commlib
