// The codecs' scalar reference (cpu_codecs_reference.h): every element through the
// __host__ __device__ functors of codecs.h, one at a time, as a GPU launcher runs them. cpu_codecs.cc's fast loops must produce
// the same bytes and values (tests/kernels/test_codec_loops.py compares them), so the CPU tests
// keep covering the arithmetic the device runs.
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cpu_codecs_reference.h"

namespace commlib {
namespace {

using kern::CodecKind;
using kern::DTypeTraits;

template <class G, DType D>
void encode_ref(const CodecSpec& spec, const void* src, size_t n, uint8_t* dst, uint64_t base) {
  using Tr = DTypeTraits<D>;
  const auto* x = static_cast<const typename Tr::storage*>(src);
  if constexpr (std::is_void<G>::value) {
    for (size_t i = 0; i < n; ++i) {
      const float xi = static_cast<float>(Tr::load(x[i]));
      const uint16_t b = kern::bf16_encode<D>(xi, spec.stochastic ? kern::sr_draw(spec.seed, base + i, xi) : -1.0);
      std::memcpy(dst + 2 * i, &b, 2);
    }
  } else {
    constexpr bool kNibbles = std::is_same<G, kern::Int4Grid>::value;
    const size_t B = static_cast<size_t>(spec.block), blocks = (n + B - 1) / B;
    uint8_t* payload = dst + blocks;
    std::memset(payload, 0, kNibbles ? (n + 1) / 2 : n);
    for (size_t blk = 0; blk < blocks; ++blk) {
      const size_t b0 = blk * B, b1 = b0 + B < n ? b0 + B : n;
      float amax = 0.0f;
      for (size_t i = b0; i < b1; ++i) {
        const float a = std::fabs(static_cast<float>(Tr::load(x[i])));
        amax = (a - a == 0.0f && a > amax) ? a : amax;  // finite values only
      }
      const int e = kern::block_scale_exp<G, D>(amax, !spec.stochastic);
      dst[blk] = static_cast<uint8_t>(static_cast<int8_t>(e));
      for (size_t i = b0; i < b1; ++i) {
        const float xi = static_cast<float>(Tr::load(x[i]));
        const uint8_t c = kern::encode_element<G, D>(xi, e, spec.stochastic ? kern::sr_draw(spec.seed, base + i, xi) : -1.0);
        if (kNibbles)
          payload[i >> 1] = static_cast<uint8_t>(payload[i >> 1] | ((c & 0xf) << ((i & 1) * 4)));
        else
          payload[i] = c;
      }
    }
  }
}

template <class G, DType D>
void decode_ref(const CodecSpec& spec, const uint8_t* src, size_t n, void* dst) {
  using Tr = DTypeTraits<D>;
  auto* y = static_cast<typename Tr::storage*>(dst);
  if constexpr (std::is_void<G>::value) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      y[i] = Tr::store(kern::bf16_decode(b));
    }
  } else {
    constexpr bool kNibbles = std::is_same<G, kern::Int4Grid>::value;
    const size_t B = static_cast<size_t>(spec.block);
    const uint8_t* payload = src + (n + B - 1) / B;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t c = kNibbles ? static_cast<uint8_t>((payload[i >> 1] >> ((i & 1) * 4)) & 0xf) : payload[i];
      y[i] = Tr::store(kern::decode_element<G>(c, static_cast<int8_t>(src[i / B])));
    }
  }
}

template <class G>
void by_dtype(bool enc, const CodecSpec& spec, DType dtype, const void* src, size_t n, void* dst, uint64_t base) {
  auto run = [&](auto d) {
    constexpr DType D = decltype(d)::value;
    if (enc)
      encode_ref<G, D>(spec, src, n, static_cast<uint8_t*>(dst), base);
    else
      decode_ref<G, D>(spec, static_cast<const uint8_t*>(src), n, dst);
  };
  switch (dtype) {
    case DType::Float32: return run(std::integral_constant<DType, DType::Float32>{});
    case DType::Float16: return run(std::integral_constant<DType, DType::Float16>{});
    default: return run(std::integral_constant<DType, DType::BFloat16>{});  // check_codec ruled out the rest
  }
}

void reference(bool enc, const CodecSpec& spec, DType dtype, const void* src, size_t n, void* dst, uint64_t base) {
  check_codec(spec, dtype);
  switch (spec.kind) {
    case CodecKind::BF16: return by_dtype<void>(enc, spec, dtype, src, n, dst, base);
    case CodecKind::FP8E4M3: return by_dtype<kern::E4M3Grid>(enc, spec, dtype, src, n, dst, base);
    case CodecKind::FP8E5M2: return by_dtype<kern::E5M2Grid>(enc, spec, dtype, src, n, dst, base);
    case CodecKind::Int8: return by_dtype<kern::Int8Grid>(enc, spec, dtype, src, n, dst, base);
    default: return by_dtype<kern::Int4Grid>(enc, spec, dtype, src, n, dst, base);
  }
}

}  // namespace

void codec_encode_reference(const CodecSpec& spec, DType dtype, const void* src, size_t n, uint8_t* dst,
                            uint64_t counter_base) {
  reference(true, spec, dtype, src, n, dst, counter_base);
}

void codec_decode_reference(const CodecSpec& spec, DType dtype, const uint8_t* src, size_t n, void* dst) {
  reference(false, spec, dtype, src, n, dst, 0);
}

}  // namespace commlib
