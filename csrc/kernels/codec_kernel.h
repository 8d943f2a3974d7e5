// The codecs' device kernel bodies (docs/compression.md "Codecs on the device"): the functors of
// codecs.h run by grid-stride loops, shared by the CUDA launcher (cuda_codecs.cu, <<<>>> on a
// stream) and the emulated device (device/emulated/emulated_kernels.cc, through cuda_shim.h), as
// elementwise_kernel.h is for the reductions: CI runs the GPU's own code.
//
// An encode with scales is two launches on one stream: one thread per block finds the block's
// largest finite magnitude and writes its scale byte, then one thread per payload byte codes its
// element(s) at the scale it reads back. int4 packs two codes a byte and a block may end inside a
// byte (odd block sizes), so a thread owns a whole byte, never a block: no two threads write one
// byte. Every value comes from the functors exactly as the scalar reference runs them
// (cpu_codecs_reference.cc), so the bytes and the decoded bits equal the CPU codecs'.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/codecs.h"
#include "kernels/cuda_shim.h"

namespace commlib {
namespace gpu {

constexpr int kCodecThreads = 256;
constexpr size_t kCodecMaxBlocks = 8192;  // grid-stride beyond this

// What one launch codes: `src` -> `dst` (encode: n elements of the dtype -> codec bytes; decode
// the other way), with the spec's block size, rounding and seed; `base` numbers src's first
// element for stochastic rounding.
struct CodecArgs {
  const void* src;
  void* dst;
  size_t n;
  size_t block;
  bool stochastic;
  uint64_t seed;
  uint64_t base;
};

inline unsigned codec_grid(size_t work) {
  return static_cast<unsigned>(std::min<size_t>((work + kCodecThreads - 1) / kCodecThreads, kCodecMaxBlocks));
}

__device__ __forceinline__ size_t codec_tid() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t codec_stride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

template <DType D>
__device__ __forceinline__ float codec_load(const void* src, size_t i) {
  using Tr = kern::DTypeTraits<D>;
  return static_cast<float>(Tr::load(static_cast<const typename Tr::storage*>(src)[i]));
}

// Pass 1 of an encode with scales: a thread per block writes the block's scale byte at dst[blk].
template <class G, DType D>
__device__ __forceinline__ void codec_scales_body(const CodecArgs& a) {
  const size_t blocks = (a.n + a.block - 1) / a.block;
  uint8_t* scales = static_cast<uint8_t*>(a.dst);
  for (size_t blk = codec_tid(); blk < blocks; blk += codec_stride()) {
    const size_t b0 = blk * a.block, b1 = b0 + a.block < a.n ? b0 + a.block : a.n;
    float amax = 0.0f;
    for (size_t i = b0; i < b1; ++i) {
      const float v = fabsf(codec_load<D>(a.src, i));
      amax = (v - v == 0.0f && v > amax) ? v : amax;  // finite values only
    }
    scales[blk] = static_cast<uint8_t>(static_cast<int8_t>(kern::block_scale_exp<G, D>(amax, !a.stochastic)));
  }
}

template <class G, DType D>
__device__ __forceinline__ uint8_t codec_code(const CodecArgs& a, const uint8_t* scales, size_t i) {
  const float x = codec_load<D>(a.src, i);
  const int e = static_cast<int8_t>(scales[i / a.block]);
  return kern::encode_element<G, D>(x, e, a.stochastic ? kern::sr_draw(a.seed, a.base + i, x) : -1.0);
}

// Pass 2: a thread per payload byte (int4: elements 2k and 2k + 1, the high nibble 0 past n).
template <class G, DType D>
__device__ __forceinline__ void codec_codes_body(const CodecArgs& a) {
  const uint8_t* scales = static_cast<const uint8_t*>(a.dst);
  uint8_t* payload = static_cast<uint8_t*>(a.dst) + (a.n + a.block - 1) / a.block;
  if constexpr (std::is_same<G, kern::Int4Grid>::value) {
    const size_t bytes = (a.n + 1) / 2;
    for (size_t k = codec_tid(); k < bytes; k += codec_stride()) {
      const uint8_t lo = codec_code<G, D>(a, scales, 2 * k) & 0xf;
      const uint8_t hi = 2 * k + 1 < a.n ? codec_code<G, D>(a, scales, 2 * k + 1) & 0xf : 0;
      payload[k] = static_cast<uint8_t>(lo | (hi << 4));
    }
  } else {
    for (size_t i = codec_tid(); i < a.n; i += codec_stride()) payload[i] = codec_code<G, D>(a, scales, i);
  }
}

// bf16 (no scales): a thread per element, two bytes each.
template <DType D>
__device__ __forceinline__ void bf16_encode_body(const CodecArgs& a) {
  uint8_t* out = static_cast<uint8_t*>(a.dst);
  for (size_t i = codec_tid(); i < a.n; i += codec_stride()) {
    const float x = codec_load<D>(a.src, i);
    const uint16_t b = kern::bf16_encode<D>(x, a.stochastic ? kern::sr_draw(a.seed, a.base + i, x) : -1.0);
    out[2 * i] = static_cast<uint8_t>(b & 0xff);
    out[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
}

// Decode: a thread per element (G void: bf16).
template <class G, DType D>
__device__ __forceinline__ void codec_decode_body(const CodecArgs& a) {
  using Tr = kern::DTypeTraits<D>;
  const uint8_t* in = static_cast<const uint8_t*>(a.src);
  auto* y = static_cast<typename Tr::storage*>(a.dst);
  for (size_t i = codec_tid(); i < a.n; i += codec_stride()) {
    if constexpr (std::is_void<G>::value) {
      const uint16_t b = static_cast<uint16_t>(in[2 * i] | (in[2 * i + 1] << 8));
      y[i] = Tr::store(kern::bf16_decode(b));
    } else {
      const uint8_t* payload = in + (a.n + a.block - 1) / a.block;
      const uint8_t c = std::is_same<G, kern::Int4Grid>::value ? static_cast<uint8_t>((payload[i >> 1] >> ((i & 1) * 4)) & 0xf)
                                                               : payload[i];
      y[i] = Tr::store(kern::decode_element<G>(c, static_cast<int8_t>(in[i / a.block])));
    }
  }
}

// Hands a launcher the grid type (void for bf16) and storage dtype of a checked spec:
// Launch has template <class G, DType D> void run().
template <class G>
struct GridTag {
  using type = G;
};

template <class Launch>
void dispatch_codec(kern::CodecKind kind, DType dtype, Launch& launch) {
  auto by_dtype = [&](auto tag) {
    using G = typename decltype(tag)::type;
    switch (dtype) {
      case DType::Float32: return launch.template run<G, DType::Float32>();
      case DType::Float16: return launch.template run<G, DType::Float16>();
      case DType::BFloat16: return launch.template run<G, DType::BFloat16>();
      default:
        throw std::invalid_argument(std::string("dtype: compression codes float32, float16 and bfloat16 data, not ") +
                                    dtype_name(dtype));
    }
  };
  switch (kind) {
    case kern::CodecKind::BF16: return by_dtype(GridTag<void>{});
    case kern::CodecKind::FP8E4M3: return by_dtype(GridTag<kern::E4M3Grid>{});
    case kern::CodecKind::FP8E5M2: return by_dtype(GridTag<kern::E5M2Grid>{});
    case kern::CodecKind::Int8: return by_dtype(GridTag<kern::Int8Grid>{});
    case kern::CodecKind::Int4: return by_dtype(GridTag<kern::Int4Grid>{});
    default: throw std::invalid_argument("compress: unknown codec " + std::to_string(static_cast<int>(kind)));
  }
}

inline CodecArgs codec_args(const CodecSpec& spec, const void* src, size_t n, void* dst, uint64_t base) {
  return CodecArgs{src, dst, n, static_cast<size_t>(spec.block), spec.stochastic, spec.seed, base};
}

}  // namespace gpu
}  // namespace commlib
