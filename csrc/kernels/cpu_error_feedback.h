// Error feedback's step on the CPU, fused (docs/compression.md "Error feedback"): one pass over a
// float32 gradient and its residual instead of an add, a round trip and a subtraction over whole
// buffers (each a fresh allocation and a full pass over memory).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_codecs.h"

namespace commlib {

// s = grad + residual; grad = decode(encode(s)) (the codec's projection Q); residual = s - Q(s).
// Element i draws its stochastic rounding at counter_base + i, as codec_encode numbers it, so the
// result is bit for bit that of codec_encode / codec_decode on s (tests/kernels/test_codec_loops.py).
// grad and residual: n float32 each, not overlapping. Throws std::invalid_argument naming the
// argument for a spec no codec takes.
void codec_error_feedback(const CodecSpec& spec, float* grad, float* residual, size_t n, uint64_t counter_base = 0);

}  // namespace commlib
