// A codec as a call passes it (compress=, docs/compression.md) and what its encoded layout takes:
// host-only inline code shared by the CPU loops (cpu_codecs.cc), the device launchers
// (cuda_codecs.cu, the emulated device) and the engines, so every module that launches a codec
// checks it and sizes its bytes alike without linking the CPU loops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/types.h"

namespace commlib {
namespace kern {
enum class CodecKind : uint8_t { None = 0, BF16 = 1, FP8E4M3 = 2, FP8E5M2 = 3, Int8 = 4, Int4 = 5 };
}  // namespace kern

struct CodecSpec {
  kern::CodecKind kind = kern::CodecKind::None;
  int64_t block = 32;       // elements per scale (ignored by bf16)
  bool stochastic = false;  // stochastic rounding (else nearest, ties to even)
  uint64_t seed = 0;        // stochastic rounding's stream; element i of a region uses counter base+i
  bool inter_only = false;  // compress_inter_only: messages between ranks of one host travel raw
  // Streaming (host/compressed_lowering.cc): a message is coded in pieces of this many bytes of
  // input, rounded down to whole blocks (0: whole), so the codec overlaps the wire. The pieces lay
  // the message out, so the ranks must agree: it joins the descriptor's hash.
  int64_t piece_bytes = 0;
  bool active() const { return kind != kern::CodecKind::None; }
};

// Scale bytes of n elements (one per block; bf16 has none), and their codes' bytes.
inline size_t codec_scale_bytes(const CodecSpec& spec, size_t n) {
  return spec.kind == kern::CodecKind::BF16 ? 0 : (n + static_cast<size_t>(spec.block) - 1) / static_cast<size_t>(spec.block);
}
inline size_t codec_payload_bytes(kern::CodecKind kind, size_t n) {
  return kind == kern::CodecKind::BF16 ? 2 * n : kind == kern::CodecKind::Int4 ? (n + 1) / 2 : n;
}
// Bytes that n elements encode to (scales + payload).
inline size_t codec_encoded_bytes(const CodecSpec& spec, size_t n) {
  return codec_scale_bytes(spec, n) + codec_payload_bytes(spec.kind, n);
}

// Throws std::invalid_argument naming the argument unless the spec can code dtype.
inline void check_codec(const CodecSpec& spec, DType dtype) {
  if (spec.kind == kern::CodecKind::None || static_cast<uint8_t>(spec.kind) > static_cast<uint8_t>(kern::CodecKind::Int4))
    throw std::invalid_argument("compress: unknown codec " + std::to_string(static_cast<int>(spec.kind)));
  if (spec.block < 1 || spec.block > (int64_t{1} << 24))
    throw std::invalid_argument("block_size: must be in [1, 2^24], got " + std::to_string(spec.block));
  if (dtype != DType::Float32 && dtype != DType::Float16 && dtype != DType::BFloat16)
    throw std::invalid_argument(std::string("dtype: compression codes float32, float16 and bfloat16 data, not ") +
                                dtype_name(dtype));
}

}  // namespace commlib
