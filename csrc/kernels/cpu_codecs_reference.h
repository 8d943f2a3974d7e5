// The codecs' scalar reference (cpu_codecs_reference.cc): codec_encode / codec_decode through the
// functors of codecs.h one element at a time, what a GPU launcher runs. The fast loops of
// cpu_codecs.cc are tested against it (same bytes, same values: tests/kernels/test_codec_loops.py).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_codecs.h"

namespace commlib {

void codec_encode_reference(const CodecSpec& spec, DType dtype, const void* src, size_t n, uint8_t* dst,
                            uint64_t counter_base = 0);
void codec_decode_reference(const CodecSpec& spec, DType dtype, const uint8_t* src, size_t n, void* dst);

}  // namespace commlib
