// CPU reduction loops: the functors of reduce_ops.h applied by plain loops that gcc
// auto-vectorises at -O3, compiled three times (baseline x86-64 / AVX2+FMA+F16C / AVX-512) and
// picked at run time from CPUID. No -march=native: the wheel runs on any x86-64. float16 on the
// AVX2/AVX-512 paths converts with F16C instructions (see f16c_reduce below); everything else,
// bfloat16 included, is the generic loop.
//
// Memory access goes through aligned(1) typedefs, so unaligned pointers are fine (the vectoriser
// then uses unaligned loads and stores, which cost nothing extra on aligned data on any x86 since
// Nehalem). dst may alias src exactly: `#pragma GCC ivdep` tells gcc there is no loop-carried
// dependence (true: element i only reads and writes element i), which is what keeps the loop
// vectorised without a run-time overlap check falling back to scalar code.
#include "kernels/cpu_reduce.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/params.h"
#include "kernels/cpu_features.h"
#include "kernels/reduce_ops.h"

// The x86 paths use gcc's target attributes and `#pragma GCC target` regions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define COMMLIB_HAVE_X86_PATHS 1
#include <immintrin.h>
#endif

namespace commlib {
namespace {

using kern::DTypeTraits;

template <typename S>
struct Unaligned;
#define COMMLIB_UNALIGNED(T)                                            \
  template <>                                                           \
  struct Unaligned<T> {                                                 \
    typedef T type __attribute__((aligned(1), may_alias));              \
  };
COMMLIB_UNALIGNED(float)
COMMLIB_UNALIGNED(double)
COMMLIB_UNALIGNED(uint16_t)
COMMLIB_UNALIGNED(int8_t)
COMMLIB_UNALIGNED(uint8_t)
COMMLIB_UNALIGNED(int32_t)
COMMLIB_UNALIGNED(int64_t)
#undef COMMLIB_UNALIGNED

template <DType D, class Op>
COMMLIB_FORCEINLINE void reduce_loop(void* dst, const void* src, size_t n) {
  using Tr = DTypeTraits<D>;
  using U = typename Unaligned<typename Tr::storage>::type;
  U* d = static_cast<U*>(dst);
  const U* s = static_cast<const U*>(src);
  const Op op{};
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) d[i] = Tr::store(op(Tr::load(d[i]), Tr::load(s[i])));
}

template <DType D>
COMMLIB_FORCEINLINE void scale_loop(void* dst, const void* src, size_t n, double scale) {
  using Tr = DTypeTraits<D>;
  using U = typename Unaligned<typename Tr::storage>::type;
  U* d = static_cast<U*>(dst);
  const U* s = static_cast<const U*>(src);
  const kern::Scale<typename Tr::compute> op(scale);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) d[i] = Tr::store(op(Tr::load(s[i])));
}

template <DType D>
COMMLIB_FORCEINLINE void divide_loop(void* dst, size_t n, int64_t divisor) {
  using Tr = DTypeTraits<D>;
  using U = typename Unaligned<typename Tr::storage>::type;
  U* d = static_cast<U*>(dst);
  const kern::Divide<typename Tr::compute> op(divisor);
  for (size_t i = 0; i < n; ++i) d[i] = Tr::store(op(Tr::load(d[i])));
}

#ifdef COMMLIB_HAVE_X86_PATHS
// float16 with F16C: the integer conversions of reduce_ops.h are exact but cost ~20 vector ops
// per element (variable shifts, selects), which makes float16 compute-bound at ~1 GB/s. The
// hardware converts 8 values per instruction with the same results (round to nearest even,
// subnormals exact; NaNs differ only in quieting, and every NaN a functor returns is canonical).
// Each group of 8 is widened, the same functor runs on the 8 floats (gcc SLP-vectorises it into
// one vector op, the round trip through the small arrays disappears), and the result is rounded
// back. These functions carry their own target (they use intrinsics) and are called, not
// inlined, from the AVX2/AVX-512 entry points.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

constexpr int kF16Round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// dst[0..8) = op(dst[0..8), src[0..8)) on float16 bit patterns.
template <class Op>
COMMLIB_FORCEINLINE void f16c_reduce8(unsigned char* d, const unsigned char* s, const Op& op) {
  float a[8], b[8];
  _mm256_storeu_ps(a, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d))));
  _mm256_storeu_ps(b, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))));
  for (int j = 0; j < 8; ++j) a[j] = op(a[j], b[j]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm256_cvtps_ph(_mm256_loadu_ps(a), kF16Round));
}

// dst[0..8) = f(src[0..8)) on float16 bit patterns.
template <class F>
COMMLIB_FORCEINLINE void f16c_map8(unsigned char* d, const unsigned char* s, const F& f) {
  float a[8];
  _mm256_storeu_ps(a, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))));
  for (int j = 0; j < 8; ++j) a[j] = f(a[j]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm256_cvtps_ph(_mm256_loadu_ps(a), kF16Round));
}

template <class Op>
__attribute__((noinline)) void f16c_reduce(void* dst, const void* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  const Op op{};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) f16c_reduce8(d + 2 * i, s + 2 * i, op);
  if (i < n) {  // tail through zero-padded copies: the same instructions, so the same numerics
    unsigned char td[16] = {}, ts[16] = {};
    const size_t bytes = 2 * (n - i);
    memcpy(td, d + 2 * i, bytes);
    memcpy(ts, s + 2 * i, bytes);
    f16c_reduce8(td, ts, op);
    memcpy(d + 2 * i, td, bytes);
  }
}

template <class F>
__attribute__((noinline)) void f16c_map(void* dst, const void* src, size_t n, const F& f) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) f16c_map8(d + 2 * i, s + 2 * i, f);
  if (i < n) {
    unsigned char t[16] = {};
    const size_t bytes = 2 * (n - i);
    memcpy(t, s + 2 * i, bytes);
    f16c_map8(t, t, f);
    memcpy(d + 2 * i, t, bytes);
  }
}

void f16c_scale(void* dst, const void* src, size_t n, double scale) {
  f16c_map(dst, src, n, kern::Scale<float>(scale));
}

void f16c_divide(void* dst, size_t n, int64_t divisor) { f16c_map(dst, dst, n, kern::Divide<float>(divisor)); }
#pragma GCC pop_options
#endif

template <bool kF16C>
struct ReduceVisitor {
  void* dst;
  const void* src;
  size_t n;
  template <DType D, class Op>
  COMMLIB_FORCEINLINE void reduce() {
#ifdef COMMLIB_HAVE_X86_PATHS
    if constexpr (kF16C && D == DType::Float16) return f16c_reduce<Op>(dst, src, n);
#endif
    reduce_loop<D, Op>(dst, src, n);
  }
};

template <bool kF16C>
struct ScaleVisitor {
  void* dst;
  const void* src;
  size_t n;
  double scale;
  template <DType D>
  COMMLIB_FORCEINLINE void typed() {
#ifdef COMMLIB_HAVE_X86_PATHS
    if constexpr (kF16C && D == DType::Float16) return f16c_scale(dst, src, n, scale);
#endif
    scale_loop<D>(dst, src, n, scale);
  }
};

template <bool kF16C>
struct DivideVisitor {
  void* dst;
  size_t n;
  int64_t divisor;
  template <DType D>
  COMMLIB_FORCEINLINE void typed() {
#ifdef COMMLIB_HAVE_X86_PATHS
    if constexpr (kF16C && D == DType::Float16) return f16c_divide(dst, n, divisor);
#endif
    divide_loop<D>(dst, n, divisor);
  }
};

// One set of entry points per instruction set. Everything below them is always_inline and has
// the default target, so it is compiled (and vectorised) with the entry point's target.
#define COMMLIB_DEFINE_PATH(NAME, TARGET, F16C)                                               \
  TARGET void reduce_##NAME(void* d, const void* s, size_t n, DType t, RedOp op) {            \
    ReduceVisitor<F16C> v{d, s, n};                                                           \
    kern::dispatch_reduce(t, op, v);                                                          \
  }                                                                                           \
  TARGET void scale_##NAME(void* d, const void* s, size_t n, DType t, double scale) {         \
    ScaleVisitor<F16C> v{d, s, n, scale};                                                     \
    kern::dispatch_dtype(t, v);                                                               \
  }                                                                                           \
  TARGET void divide_##NAME(void* d, size_t n, DType t, int64_t divisor) {                    \
    DivideVisitor<F16C> v{d, n, divisor};                                                     \
    kern::dispatch_dtype(t, v);                                                               \
  }

COMMLIB_DEFINE_PATH(baseline, , false)
#ifdef COMMLIB_HAVE_X86_PATHS
COMMLIB_DEFINE_PATH(avx2, __attribute__((target("avx2,fma,f16c,bmi2"))), true)
COMMLIB_DEFINE_PATH(avx512,
                    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2,"
                                          "prefer-vector-width=512"))),
                    true)
#endif
#undef COMMLIB_DEFINE_PATH

struct Path {
  const char* name;
  void (*reduce)(void*, const void*, size_t, DType, RedOp);
  void (*scale)(void*, const void*, size_t, DType, double);
  void (*divide)(void*, size_t, DType, int64_t);
  bool (*supported)();
};

bool always() { return true; }
#ifdef COMMLIB_HAVE_X86_PATHS
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("bmi2");
}
bool has_avx512() {
  __builtin_cpu_init();
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif

// Best first.
const Path kPaths[] = {
#ifdef COMMLIB_HAVE_X86_PATHS
    {"avx512", reduce_avx512, scale_avx512, divide_avx512, has_avx512},
    {"avx2", reduce_avx2, scale_avx2, divide_avx2, has_avx2},
#endif
    {"baseline", reduce_baseline, scale_baseline, divide_baseline, always},
};
constexpr int kNumPaths = sizeof(kPaths) / sizeof(kPaths[0]);

int find_path(const std::string& name) {
  for (int i = 0; i < kNumPaths; ++i)
    if (name == kPaths[i].name) return i;
  return -1;
}

int select_path() {
  int first = 0;
  if (param_set("COMMLIB_CPU_PATH")) {
    const int cap = find_path(param_string("COMMLIB_CPU_PATH"));
    if (cap >= 0) first = cap;  // unknown names are ignored: never fail at load time
  }
  for (int i = first; i < kNumPaths; ++i)
    if (kPaths[i].supported()) return i;
  return kNumPaths - 1;
}

std::atomic<int>& current_index() {
  static std::atomic<int> index{select_path()};
  return index;
}

inline const Path& current() { return kPaths[current_index().load(std::memory_order_relaxed)]; }

}  // namespace

void reduce_inplace(void* dst, const void* src, size_t n, DType dtype, RedOp op) {
  current().reduce(dst, src, n, dtype, op);
}

void scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale) {
  current().scale(dst, src, n, dtype, scale);
}

void divide_inplace(void* dst, size_t n, DType dtype, int64_t divisor) {
  kern::check_divisor(divisor);
  current().divide(dst, n, dtype, divisor);
}

const char* cpu_reduce_path() { return current().name; }

std::vector<std::string> cpu_reduce_paths_supported() {
  std::vector<std::string> out;
  for (int i = 0; i < kNumPaths; ++i)
    if (kPaths[i].supported()) out.emplace_back(kPaths[i].name);
  return out;
}

std::string set_cpu_reduce_path(const std::string& path) {
  const int i = find_path(path);
  if (i < 0 || !kPaths[i].supported())
    throw std::invalid_argument("path: '" + path + "' is not a CPU reduction path supported here");
  const std::string prev = cpu_reduce_path();
  current_index().store(i);
  return prev;
}

}  // namespace commlib
