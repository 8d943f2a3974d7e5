// Error feedback's fused step (cpu_error_feedback.h). Work goes in chunks of whole blocks that stay
// in L1: s = src + residual into a stack buffer (src: grad itself, or the gradient DataParallel
// copies into its bucket), then per block the projection, written straight back into grad and
// residual. int8/int4 under nearest rounding (what training uses) project in one branch-free loop
// gcc vectorises, at the baseline's SSE2 and, where the CPU has it, AVX2 (the entries below), with
// the block's scale in closed form (as cpu_codecs.cc's int loops: y = s * 2^-e in float, rint by
// the 1.5 * 2^23 trick, times 2^e: the decoded code, exact); every other
// codec, rounding or block (non-finite values, a top code past float32's largest) goes through
// codec_encode / codec_decode on the chunk or the block, so it is their result by construction.
// codec_project is the same projection alone, in place: the compressed lowering's projection of a
// sum it makes (host/compressed_lowering.cc).
#include "kernels/cpu_error_feedback.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu_codec_loops.h"
#include "kernels/cpu_features.h"

namespace commlib {
namespace {

using kern::CodecKind;
constexpr size_t kChunk = 2048;  // elements of s per chunk (8 KiB: with grad and residual's lines, L1)

// grad = Q(s), residual = s - Q(s) through the codec's own entry points (n whole blocks, or the
// region's tail). `bytes` is scratch.
void project_generic(const CodecSpec& spec, const float* s, size_t n, uint64_t counter, float* grad, float* residual,
                     std::vector<uint8_t>& bytes) {
  bytes.resize(codec_encoded_bytes(spec, n));
  codec_encode(spec, DType::Float32, s, n, bytes.data(), counter);
  codec_decode(spec, DType::Float32, bytes.data(), n, grad);
  for (size_t i = 0; i < n; ++i) residual[i] = s[i] - grad[i];
}

// One finite block of an integer grid at scale 2^e, nearest: the codes are rint(s * 2^-e) in
// [-top, top] (block_scale_exp picks e so), never the NaN code, and decode to code * 2^e.
COMMLIB_FORCEINLINE void project_int_block(const float* s, size_t n, int e, float* grad, float* residual) {
  const float inv = static_cast<float>(kern::pow2(-e)), scale = static_cast<float>(kern::pow2(e));
  for (size_t i = 0; i < n; ++i) {
    const float y = s[i] * inv;
    const float q = static_cast<float>(static_cast<int32_t>((y + loops::kRoundMagic) - loops::kRoundMagic)) * scale;
    grad[i] = q;
    residual[i] = s[i] - q;
  }
}

// The same projection alone (q may be s: each element is read before it is written).
COMMLIB_FORCEINLINE void project_int_block(const float* s, size_t n, int e, float* q) {
  const float inv = static_cast<float>(kern::pow2(-e)), scale = static_cast<float>(kern::pow2(e));
  for (size_t i = 0; i < n; ++i) {
    const float y = s[i] * inv;
    q[i] = static_cast<float>(static_cast<int32_t>((y + loops::kRoundMagic) - loops::kRoundMagic)) * scale;
  }
}

// The projection of n float32 elements in place, blocks from x[0]: int8/int4 nearest.
template <class G>
COMMLIB_FORCEINLINE void project_int_nearest(const CodecSpec& spec, float* x, size_t n, uint64_t base,
                                             std::vector<uint8_t>& bytes) {
  const size_t B = static_cast<size_t>(spec.block);
  for (size_t b0 = 0; b0 < n; b0 += B) {
    const size_t k = std::min(B, n - b0);
    bool finite;
    const float amax = loops::block_amax<DType::Float32>(x + b0, k, &finite);
    const int e = loops::int_scale_exp<G, DType::Float32>(amax, true);
    if (finite && G::top * kern::pow2(e) <= kern::StorageLimits<DType::Float32>::max) {
      project_int_block(x + b0, k, e, x + b0);
    } else {  // NaN/Inf, or a top code past float32's largest: the codec's own path for this block
      bytes.resize(codec_encoded_bytes(spec, k));
      codec_encode(spec, DType::Float32, x + b0, k, bytes.data(), base + b0);
      codec_decode(spec, DType::Float32, bytes.data(), k, x + b0);
    }
  }
}

template <class G>
COMMLIB_FORCEINLINE void feedback_int_nearest(const CodecSpec& spec, const float* src, float* grad, float* residual,
                                              size_t n, uint64_t base, std::vector<float>& s,
                                              std::vector<uint8_t>& bytes) {
  const size_t B = static_cast<size_t>(spec.block);
  const size_t per = std::max(B, kChunk / B * B);
  s.resize(std::min(per, n));
  for (size_t c0 = 0; c0 < n; c0 += per) {
    const size_t m = std::min(per, n - c0);
    float* g = grad + c0;
    float* r = residual + c0;
    for (size_t i = 0; i < m; ++i) s[i] = src[c0 + i] + r[i];
    for (size_t b0 = 0; b0 < m; b0 += B) {
      const size_t k = std::min(B, m - b0);
      bool finite;
      const float amax = loops::block_amax<DType::Float32>(s.data() + b0, k, &finite);
      const int e = loops::int_scale_exp<G, DType::Float32>(amax, true);
      if (finite && G::top * kern::pow2(e) <= kern::StorageLimits<DType::Float32>::max)
        project_int_block(s.data() + b0, k, e, g + b0, r + b0);
      else
        project_generic(spec, s.data() + b0, k, base + c0 + b0, g + b0, r + b0, bytes);
    }
  }
}

void feedback_generic(const CodecSpec& spec, const float* src, float* grad, float* residual, size_t n, uint64_t base,
                      std::vector<float>& s, std::vector<uint8_t>& bytes) {
  const size_t B = spec.kind == CodecKind::BF16 ? 1 : static_cast<size_t>(spec.block);
  const size_t per = std::max(B, kChunk / B * B);  // whole blocks: each chunk codes as the region does
  s.resize(std::min(per, n));
  for (size_t c0 = 0; c0 < n; c0 += per) {
    const size_t m = std::min(per, n - c0);
    for (size_t i = 0; i < m; ++i) s[i] = src[c0 + i] + residual[c0 + i];
    project_generic(spec, s.data(), m, base + c0, grad + c0, residual + c0, bytes);
  }
}

// The int8/int4 nearest loops once per instruction set: everything above is always_inline, so each
// entry compiles (and vectorises) it with its own target. AVX2 (8 lanes and a real int32 max)
// where the CPU reduction path is a vector one (kernels/cpu_features.h: it checks the CPU, and
// set_cpu_reduce_path("baseline") sends these to SSE2 as well, so tests run both). No FMA in the
// target: each product is rounded on its own, so both entries compute the same bits (the
// projection's ops are exact or correctly rounded, whatever the vector width).
#define COMMLIB_INT_ENTRIES(SUFFIX, TARGET)                                                                      \
  template <class G>                                                                                            \
  TARGET void feedback_##SUFFIX(const CodecSpec& spec, const float* src, float* grad, float* residual, size_t n, \
                                uint64_t base, std::vector<float>& s, std::vector<uint8_t>& bytes) {            \
    feedback_int_nearest<G>(spec, src, grad, residual, n, base, s, bytes);                                     \
  }                                                                                                             \
  template <class G>                                                                                            \
  TARGET void project_##SUFFIX(const CodecSpec& spec, float* x, size_t n, uint64_t base,                       \
                               std::vector<uint8_t>& bytes) {                                                   \
    project_int_nearest<G>(spec, x, n, base, bytes);                                                           \
  }
COMMLIB_INT_ENTRIES(baseline, )
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
COMMLIB_INT_ENTRIES(avx2, __attribute__((target("avx2"))))
bool vector_path() { return std::strcmp(cpu_reduce_path(), "baseline") != 0; }
#else
#define feedback_avx2 feedback_baseline
#define project_avx2 project_baseline
bool vector_path() { return false; }
#endif
#undef COMMLIB_INT_ENTRIES

template <class G>
void feedback_int(const CodecSpec& spec, const float* src, float* grad, float* residual, size_t n, uint64_t base,
                  std::vector<float>& s, std::vector<uint8_t>& bytes) {
  if (vector_path())
    feedback_avx2<G>(spec, src, grad, residual, n, base, s, bytes);
  else
    feedback_baseline<G>(spec, src, grad, residual, n, base, s, bytes);
}

template <class G>
void project_int(const CodecSpec& spec, float* x, size_t n, uint64_t base, std::vector<uint8_t>& bytes) {
  if (vector_path())
    project_avx2<G>(spec, x, n, base, bytes);
  else
    project_baseline<G>(spec, x, n, base, bytes);
}

}  // namespace

void codec_project(const CodecSpec& spec, DType dtype, void* x, size_t n, uint64_t counter_base,
                   std::vector<uint8_t>& scratch) {
  check_codec(spec, dtype);
  if (dtype == DType::Float32 && !spec.stochastic && spec.kind == CodecKind::Int8) {
    project_int<kern::Int8Grid>(spec, static_cast<float*>(x), n, counter_base, scratch);
  } else if (dtype == DType::Float32 && !spec.stochastic && spec.kind == CodecKind::Int4) {
    project_int<kern::Int4Grid>(spec, static_cast<float*>(x), n, counter_base, scratch);
  } else {
    scratch.resize(codec_encoded_bytes(spec, n));
    codec_encode(spec, dtype, x, n, scratch.data(), counter_base);
    codec_decode(spec, dtype, scratch.data(), n, x);
  }
}

void codec_error_feedback(const CodecSpec& spec, float* grad, float* residual, size_t n, uint64_t counter_base,
                          const float* src) {
  check_codec(spec, DType::Float32);
  if (src == nullptr) src = grad;
  std::vector<float> s;
  std::vector<uint8_t> bytes;
  if (spec.kind == CodecKind::Int8 && !spec.stochastic)
    feedback_int<kern::Int8Grid>(spec, src, grad, residual, n, counter_base, s, bytes);
  else if (spec.kind == CodecKind::Int4 && !spec.stochastic)
    feedback_int<kern::Int4Grid>(spec, src, grad, residual, n, counter_base, s, bytes);
  else
    feedback_generic(spec, src, grad, residual, n, counter_base, s, bytes);
}

}  // namespace commlib
