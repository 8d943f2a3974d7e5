// Error feedback's step on the CPU, fused (docs/compression.md "Error feedback"): one pass over a
// float32 gradient and its residual instead of an add, a round trip and a subtraction over whole
// buffers (each a fresh allocation and a full pass over memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu_codecs.h"

namespace commlib {

// s = grad + residual; grad = decode(encode(s)) (the codec's projection Q); residual = s - Q(s).
// Element i draws its stochastic rounding at counter_base + i, as codec_encode numbers it, so the
// result is bit for bit that of codec_encode / codec_decode on s (tests/kernels/test_codec_loops.py).
// grad and residual: n float32 each, not overlapping. `src` (n float32; null: grad itself) is the
// gradient read in place of grad's own values: s = src + residual, grad = Q(s), so a gradient is
// copied into its bucket and fed back in one pass (DataParallel's gradient hook); it is grad
// itself or overlaps neither. Throws std::invalid_argument naming the argument for a spec no
// codec takes.
void codec_error_feedback(const CodecSpec& spec, float* grad, float* residual, size_t n, uint64_t counter_base = 0,
                          const float* src = nullptr);

// x = decode(encode(x)) in place (the codec's projection, what the compressed lowering applies to a
// sum it makes), bit for bit codec_encode then codec_decode: float32 int8/int4 under nearest
// rounding in error feedback's loop per finite block (no codes written and read back), every other
// codec, dtype, rounding or block through those two. `scratch` holds encoded bytes between calls.
void codec_project(const CodecSpec& spec, DType dtype, void* x, size_t n, uint64_t counter_base,
                   std::vector<uint8_t>& scratch);

}  // namespace commlib
