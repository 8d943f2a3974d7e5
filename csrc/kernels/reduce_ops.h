// Reduction functors and dtype traits, written once and shared by the CPU loops (cpu_reduce.cc)
// and the CUDA launcher (cuda_reduce.cu). Everything here is __host__ __device__ under nvcc and
// plain inline C++ otherwise; no CUDA or intrinsics headers are needed. The float16/bfloat16
// conversions the functors use are in float_bits.h.
//
// Numerics (identical on CPU and GPU, bit for bit):
//  - float16/bfloat16 are stored as uint16 bit patterns and computed in float32: each pairwise op
//    widens both operands, computes once in float, and rounds back once (round-to-nearest-even;
//    NaN, Inf and subnormals exact). The conversions are integer-only so that no FMA contraction
//    (gcc -ffp-contract=fast, nvcc --fmad) can change a result.
//  - Every floating result that is NaN is canonicalised (0x7fc00000 / 0x7ff8000000000000, i.e.
//    0x7e00 in float16 and 0x7fc0 in bfloat16): x86 and CUDA propagate NaN payloads differently,
//    and different ranks combine operands in different orders, yet all ranks must end bitwise
//    identical.
//  - Min/Max propagate NaN and are bitwise commutative: min(-0,+0) = min(+0,-0) = -0, and
//    max(-0,+0) = max(+0,-0) = +0.
//  - Integer Sum/Prod wrap modulo 2^bits (computed in the unsigned type, no signed-overflow UB).
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/types.h"
#include "kernels/float_bits.h"

namespace commlib {
namespace kern {

// Floating types as the functors see them (float16/bfloat16 compute in float).
template <typename T>
struct IsFloat : std::integral_constant<bool, std::is_same<T, float>::value || std::is_same<T, double>::value> {};

// ---------------------------------------------------------------------------------------------
// Functors on the compute type T (float for float16/bfloat16).
struct Sum {
  template <typename T>
  COMMLIB_HDI T operator()(T a, T b) const {
    if constexpr (IsFloat<T>::value) {
      return canon(a + b);
    } else {
      using U = typename std::make_unsigned<T>::type;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  }
};

struct Prod {
  template <typename T>
  COMMLIB_HDI T operator()(T a, T b) const {
    if constexpr (IsFloat<T>::value) {
      return canon(a * b);
    } else {
      using U = typename std::make_unsigned<T>::type;
      // uint8 promotes to int: 255 * 255 fits, no overflow. 32/64-bit stay unsigned.
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    }
  }
};

struct Min {
  template <typename T>
  COMMLIB_HDI T operator()(T a, T b) const {
    if constexpr (std::is_same<T, float>::value) {
      const uint32_t ua = f32_bits(a), ub = f32_bits(b);
      // Equal values have equal bits except +-0, where OR picks -0.
      const uint32_t r = a < b ? ua : (b < a ? ub : (ua | ub));
      return (a != a || b != b) ? f32_from_bits(kF32CanonicalNaN) : f32_from_bits(r);
    } else if constexpr (std::is_same<T, double>::value) {
      const uint64_t ua = f64_bits(a), ub = f64_bits(b);
      const uint64_t r = a < b ? ua : (b < a ? ub : (ua | ub));
      return (a != a || b != b) ? f64_from_bits(kF64CanonicalNaN) : f64_from_bits(r);
    } else {
      return b < a ? b : a;
    }
  }
};

struct Max {
  template <typename T>
  COMMLIB_HDI T operator()(T a, T b) const {
    if constexpr (std::is_same<T, float>::value) {
      const uint32_t ua = f32_bits(a), ub = f32_bits(b);
      // Equal values have equal bits except +-0, where AND picks +0.
      const uint32_t r = a > b ? ua : (b > a ? ub : (ua & ub));
      return (a != a || b != b) ? f32_from_bits(kF32CanonicalNaN) : f32_from_bits(r);
    } else if constexpr (std::is_same<T, double>::value) {
      const uint64_t ua = f64_bits(a), ub = f64_bits(b);
      const uint64_t r = a > b ? ua : (b > a ? ub : (ua & ub));
      return (a != a || b != b) ? f64_from_bits(kF64CanonicalNaN) : f64_from_bits(r);
    } else {
      return b > a ? b : a;
    }
  }
};

struct BAnd {
  template <typename T>
  COMMLIB_HDI T operator()(T a, T b) const {
    static_assert(!IsFloat<T>::value, "bitwise op on a floating type");
    return static_cast<T>(a & b);
  }
};
struct BOr {
  template <typename T>
  COMMLIB_HDI T operator()(T a, T b) const {
    static_assert(!IsFloat<T>::value, "bitwise op on a floating type");
    return static_cast<T>(a | b);
  }
};
struct BXor {
  template <typename T>
  COMMLIB_HDI T operator()(T a, T b) const {
    static_assert(!IsFloat<T>::value, "bitwise op on a floating type");
    return static_cast<T>(a ^ b);
  }
};

// Integer limits usable in device code (std::numeric_limits needs --expt-relaxed-constexpr).
template <typename T>
struct IntLimits {
  static constexpr bool is_signed = static_cast<T>(-1) < static_cast<T>(0);
  using U = typename std::make_unsigned<T>::type;
  static constexpr T max = is_signed ? static_cast<T>(static_cast<U>(~static_cast<U>(0)) >> 1)
                                     : static_cast<T>(static_cast<U>(~static_cast<U>(0)));
  static constexpr T min = is_signed ? static_cast<T>(-max - 1) : static_cast<T>(0);
};

// x * scale (premul_sum). Floats multiply in the compute type (float for f16/bf16/f32, as torch's
// opmath does with a Python scalar); integers multiply in double, round half to even and
// saturate to the type's range (NaN -> 0).
template <typename T>
struct Scale {
  using S = typename std::conditional<std::is_same<T, float>::value, float, double>::type;
  S scale;
  COMMLIB_HD explicit Scale(double s) : scale(static_cast<S>(s)) {}
  COMMLIB_HDI T operator()(T x) const {
    if constexpr (IsFloat<T>::value) {
      return canon(x * scale);
    } else {
      const double r = rint(static_cast<double>(x) * scale);
      // 2^(bits-1) (signed) or 2^bits (unsigned) is exact as a double; the max itself may not be.
      const double lo = static_cast<double>(IntLimits<T>::min);
      const double hi_excl = IntLimits<T>::is_signed ? -lo : 2.0 * (static_cast<double>(IntLimits<T>::max / 2) + 1.0);
      if (!(r == r)) return 0;
      if (r <= lo) return IntLimits<T>::min;
      if (r >= hi_excl) return IntLimits<T>::max;
      return static_cast<T>(r);
    }
  }
};

// x / divisor (avg), divisor > 0 (checked by the caller). Floats: true division in the compute
// type. Integers: truncation toward zero (as NCCL's integer avg).
template <typename T>
struct Divide {
  T d;
  bool too_big;  // divisor exceeds the type's range: every quotient truncates to 0
  COMMLIB_HD explicit Divide(int64_t divisor)
      : d(static_cast<T>(divisor)),
        too_big(exceeds(divisor)) {}
  static COMMLIB_HDI bool exceeds(int64_t divisor) {
    if constexpr (IsFloat<T>::value || sizeof(T) >= 8) {
      return false;
    } else {
      return divisor > static_cast<int64_t>(IntLimits<T>::max);
    }
  }
  COMMLIB_HDI T operator()(T x) const {
    if constexpr (IsFloat<T>::value) {
      return canon(x / d);
    } else {
      return too_big ? static_cast<T>(0) : static_cast<T>(x / d);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// dtype traits: storage type (what lives in memory) and compute type (what functors see).
template <typename S, typename C>
struct PlainTraits {
  using storage = S;
  using compute = C;
  static COMMLIB_HDI compute load(storage x) { return x; }
  static COMMLIB_HDI storage store(compute x) { return x; }
};

template <DType D>
struct DTypeTraits;
template <>
struct DTypeTraits<DType::Float32> : PlainTraits<float, float> {};
template <>
struct DTypeTraits<DType::Float64> : PlainTraits<double, double> {};
template <>
struct DTypeTraits<DType::Int8> : PlainTraits<int8_t, int8_t> {};
template <>
struct DTypeTraits<DType::UInt8> : PlainTraits<uint8_t, uint8_t> {};
template <>
struct DTypeTraits<DType::Int32> : PlainTraits<int32_t, int32_t> {};
template <>
struct DTypeTraits<DType::Int64> : PlainTraits<int64_t, int64_t> {};
template <>
struct DTypeTraits<DType::Float16> {
  using storage = uint16_t;
  using compute = float;
  // (the GPU's cvt instructions on the device, the same bits: float_bits.h)
  static COMMLIB_HDI compute load(storage x) { return half_load(x); }
  static COMMLIB_HDI storage store(compute x) { return half_store(x); }
};
template <>
struct DTypeTraits<DType::BFloat16> {
  using storage = uint16_t;
  using compute = float;
  static COMMLIB_HDI compute load(storage x) { return bf16_to_float(x); }
  // Stored values are functor results, whose NaNs are canonical.
  static COMMLIB_HDI storage store(compute x) { return float_to_bf16_canonical(x); }
};

// ---------------------------------------------------------------------------------------------
// Host-side dispatch shared by the CPU and CUDA entry points. The visitor is a struct with
//   template <DType D, class Op> void reduce();       (dispatch_reduce)
//   template <DType D> void typed();                  (dispatch_dtype)
// (structs rather than lambdas so that everything inlines into the CPU's target("avx2") clones).

[[noreturn]] inline void throw_bitwise_on_float(DType dtype, RedOp op) {
  throw std::invalid_argument(std::string("op: bitwise reduction '") + op_name(op) +
                              "' is defined for integer dtypes only, not " + dtype_name(dtype));
}

[[noreturn]] inline void throw_bad_dtype(DType dtype) {
  throw std::invalid_argument("dtype: unsupported value " + std::to_string(static_cast<int>(dtype)));
}

template <DType D, class V>
COMMLIB_FORCEINLINE void dispatch_op_for(RedOp op, V& v) {
  constexpr bool is_float = D == DType::Float32 || D == DType::Float64 || D == DType::Float16 ||
                            D == DType::BFloat16;
  switch (op) {
    case RedOp::Sum:
    case RedOp::Avg:
    case RedOp::PremulSum:
      return v.template reduce<D, Sum>();
    case RedOp::Prod:
      return v.template reduce<D, Prod>();
    case RedOp::Min:
      return v.template reduce<D, Min>();
    case RedOp::Max:
      return v.template reduce<D, Max>();
    case RedOp::BAnd:
    case RedOp::BOr:
    case RedOp::BXor:
      if constexpr (is_float) {
        throw_bitwise_on_float(D, op);
      } else {
        if (op == RedOp::BAnd) return v.template reduce<D, BAnd>();
        if (op == RedOp::BOr) return v.template reduce<D, BOr>();
        return v.template reduce<D, BXor>();
      }
    default:
      throw std::invalid_argument("op: unsupported value " + std::to_string(static_cast<int>(op)));
  }
}

template <class V>
COMMLIB_FORCEINLINE void dispatch_reduce(DType dtype, RedOp op, V& v) {
  switch (dtype) {
    case DType::Float32: return dispatch_op_for<DType::Float32>(op, v);
    case DType::Float64: return dispatch_op_for<DType::Float64>(op, v);
    case DType::Float16: return dispatch_op_for<DType::Float16>(op, v);
    case DType::BFloat16: return dispatch_op_for<DType::BFloat16>(op, v);
    case DType::Int8: return dispatch_op_for<DType::Int8>(op, v);
    case DType::UInt8: return dispatch_op_for<DType::UInt8>(op, v);
    case DType::Int32: return dispatch_op_for<DType::Int32>(op, v);
    case DType::Int64: return dispatch_op_for<DType::Int64>(op, v);
    default: throw_bad_dtype(dtype);
  }
}

template <class V>
COMMLIB_FORCEINLINE void dispatch_dtype(DType dtype, V& v) {
  switch (dtype) {
    case DType::Float32: return v.template typed<DType::Float32>();
    case DType::Float64: return v.template typed<DType::Float64>();
    case DType::Float16: return v.template typed<DType::Float16>();
    case DType::BFloat16: return v.template typed<DType::BFloat16>();
    case DType::Int8: return v.template typed<DType::Int8>();
    case DType::UInt8: return v.template typed<DType::UInt8>();
    case DType::Int32: return v.template typed<DType::Int32>();
    case DType::Int64: return v.template typed<DType::Int64>();
    default: throw_bad_dtype(dtype);
  }
}

inline void check_divisor(int64_t divisor) {
  if (divisor <= 0)
    throw std::invalid_argument("divisor: must be positive, got " + std::to_string(divisor));
}

}  // namespace kern
}  // namespace commlib
