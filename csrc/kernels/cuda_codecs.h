// CUDA entry points of the codecs of compress= (kernels/codec_kernel.h: the functors of codecs.h,
// so the bytes and decoded values equal the CPU codecs' bit for bit). Asynchronous on `stream`;
// a spec or dtype no codec takes throws std::invalid_argument naming the argument, a launch
// failure std::runtime_error. Pointers are device (or managed) memory, any alignment.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/codec_spec.h"

namespace commlib {

// encode: dst[0, codec_encoded_bytes(spec, n)) = encode(src[0, n)), counter_base numbering src's
// first element for stochastic rounding; else dst[0, n) = decode(src). `stop` (null: none): a word
// of mapped host memory; a launch that finds it nonzero when it starts writes nothing.
void cuda_codec(bool encode, const CodecSpec& spec, DType dtype, const void* src, size_t n, void* dst,
                uint64_t counter_base, cudaStream_t stream, const uint64_t* stop = nullptr);
// Loads every codec kernel now (cuda_preload_kernels' reason: no lazy module load inside a call).
void cuda_preload_codec_kernels();

}  // namespace commlib
