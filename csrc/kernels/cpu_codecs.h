// CPU entry points of the block-wise codecs (the functors live in codecs.h, docs/compression.md).
// Every entry takes a floating storage dtype (float32, float16, bfloat16; others throw
// std::invalid_argument naming `dtype`). Encoded regions are laid out as codecs.h says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/types.h"
#include "kernels/codec_spec.h"
#include "kernels/codecs.h"

namespace commlib {


// The codec as the call descriptor carries it (CallDesc::root of the rootless collectives that
// take compress=, plan/lowering.cc), so ranks that pass different codecs get a MismatchError:
// bits 0-2 the kind, bit 3 stochastic, bit 4 inter_only, bits 5-30 a hash of the block size, the
// piece size and (stochastic only: nearest rounding ignores it) the seed; bit 31 clear. 0 for no
// codec.
int32_t codec_desc_tag(const CodecSpec& spec);
// "int8 (nearest, block/piece/seed #1a2b3c)" for a tag; "" for 0 (describe_call).
std::string codec_tag_text(int32_t tag);

// Name <-> kind ("bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"); unknown names throw
// std::invalid_argument naming `compress`.
kern::CodecKind codec_kind(const std::string& name);
const char* codec_name(kern::CodecKind kind);


// dst[0, codec_encoded_bytes) = encode(src[0, n)); counter_base numbers the elements for
// stochastic rounding.
void codec_encode(const CodecSpec& spec, DType dtype, const void* src, size_t n, uint8_t* dst,
                  uint64_t counter_base = 0);

// dst[0, n) = decode(src): exact in dtype (codecs.h).
void codec_decode(const CodecSpec& spec, DType dtype, const uint8_t* src, size_t n, void* dst);

// dst = encode(x), then x = decode(dst): a send's encoding and the sender's projection. float32
// int8/int4 under nearest rounding write each block's decoded values as they code it (no second
// pass over the codes); the rest encode, then decode. Bit for bit codec_encode then codec_decode.
void codec_encode_project(const CodecSpec& spec, DType dtype, void* x, size_t n, uint8_t* dst,
                          uint64_t counter_base = 0);


}  // namespace commlib
