// CPU loops of the block-wise codecs: each block's largest finite magnitude (a reduction the
// compiler vectorises), then the block's elements through the functors of codecs.h. The loops
// are plain and branch-light so gcc vectorises what it can at -O3; a block is independent of
// the others, which is also how a GPU launcher would split the work (int4 packs two codes per
// byte across the whole region, so such a launcher gives each thread whole bytes).
#include "kernels/cpu_codecs.h"

#include "kernels/cpu_codec_loops.h"
#include "kernels/cpu_int_codec_loops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace commlib {
namespace {

using kern::CodecKind;
using kern::DTypeTraits;

size_t blocks_of(const CodecSpec& spec, size_t n) { return codec_scale_bytes(spec, n); }
size_t payload_bytes(CodecKind kind, size_t n) { return codec_payload_bytes(kind, n); }


// The integer grids: kernels/cpu_int_codec_loops.h.
using int_loops::decode_int;
using int_loops::encode_int;
using loops::block_amax;

template <class G, DType D>
void encode_scaled(const CodecSpec& spec, const void* src, size_t n, uint8_t* dst, uint64_t base) {
  using Tr = DTypeTraits<D>;
  const auto* x = static_cast<const typename Tr::storage*>(src);
  const size_t B = static_cast<size_t>(spec.block);
  uint8_t* scales = dst;
  uint8_t* payload = dst + blocks_of(spec, n);
  constexpr bool kNibbles = std::is_same<G, kern::Int4Grid>::value;
  constexpr bool kInt = kNibbles || std::is_same<G, kern::Int8Grid>::value;
  if constexpr (kInt) {
    if (encode_int<G, D>(spec, src, n, dst, base)) return;
  } else {  // fp8: the branch-free loops per finite block
    (void)kNibbles;
    for (size_t b0 = 0, blk = 0; b0 < n; b0 += B, ++blk) {
      const size_t b1 = std::min(b0 + B, n);
      bool finite;
      const float amax = block_amax<D>(x + b0, b1 - b0, &finite);
      const int e = kern::block_scale_exp<G, D>(amax, !spec.stochastic);
      scales[blk] = static_cast<uint8_t>(static_cast<int8_t>(e));
      if (finite && G::top * kern::pow2(e) <= kern::StorageLimits<D>::max) {
        if (spec.stochastic)
          loops::fp8_codes_stochastic<G, D>(x + b0, b1 - b0, e, spec.seed, base + b0, payload + b0);
        else
          loops::fp8_codes<G, D>(x + b0, b1 - b0, e, payload + b0);
      } else {
        for (size_t i = b0; i < b1; ++i) {
          const float xi = static_cast<float>(Tr::load(x[i]));
          payload[i] = kern::encode_element<G, D>(xi, e, spec.stochastic ? kern::sr_draw(spec.seed, base + i, xi) : -1.0);
        }
      }
    }
    return;
  }
  for (size_t b0 = 0, blk = 0; b0 < n; b0 += B, ++blk) {
    const size_t b1 = b0 + B < n ? b0 + B : n;
    float amax = 0.0f;
    for (size_t i = b0; i < b1; ++i) {
      const float a = std::fabs(static_cast<float>(Tr::load(x[i])));
      amax = (a - a == 0.0f && a > amax) ? a : amax;  // finite values only
    }
    const int e = kern::block_scale_exp<G, D>(amax, !spec.stochastic);
    scales[blk] = static_cast<uint8_t>(static_cast<int8_t>(e));
    for (size_t i = b0; i < b1; ++i) {
      const float xi = static_cast<float>(Tr::load(x[i]));
      const double u = spec.stochastic ? kern::sr_draw(spec.seed, base + i, xi) : -1.0;
      const uint8_t c = kern::encode_element<G, D>(xi, e, u);
      if (kNibbles)
        payload[i >> 1] = (i & 1) ? static_cast<uint8_t>(payload[i >> 1] | (c << 4)) : c;
      else
        payload[i] = c;
    }
  }
}

template <class G, DType D>
void decode_scaled(const CodecSpec& spec, const uint8_t* src, size_t n, void* dst) {
  using Tr = DTypeTraits<D>;
  auto* y = static_cast<typename Tr::storage*>(dst);
  const size_t B = static_cast<size_t>(spec.block);
  const uint8_t* scales = src;
  const uint8_t* payload = src + blocks_of(spec, n);
  constexpr bool kNibbles = std::is_same<G, kern::Int4Grid>::value;
  if constexpr (kNibbles || std::is_same<G, kern::Int8Grid>::value) {
    decode_int<G, D>(spec, src, n, dst);
  } else {
    for (size_t b0 = 0, blk = 0; b0 < n; b0 += B, ++blk)  // fp8
      loops::fp8_decode_block<G, D>(payload + b0, std::min(b0 + B, n) - b0, static_cast<int8_t>(scales[blk]), y + b0);
  }
}

// bf16 through a stack buffer of whole uint16_t (the payload may be unaligned).
template <DType D>
void encode_bf16(const CodecSpec& spec, const void* src, size_t n, uint8_t* dst, uint64_t base) {
  const auto* x = static_cast<const typename DTypeTraits<D>::storage*>(src);
  uint16_t buf[2048];
  for (size_t i = 0; i < n; i += 2048) {
    const size_t m = std::min<size_t>(2048, n - i);
    loops::bf16_encode_loop<D>(x + i, m, spec.stochastic, spec.seed, base + i, buf);
    std::memcpy(dst + 2 * i, buf, 2 * m);
  }
}

template <DType D>
void decode_bf16(const uint8_t* src, size_t n, void* dst) {
  auto* y = static_cast<typename DTypeTraits<D>::storage*>(dst);
  uint16_t buf[2048];
  for (size_t i = 0; i < n; i += 2048) {
    const size_t m = std::min<size_t>(2048, n - i);
    std::memcpy(buf, src + 2 * i, 2 * m);
    loops::bf16_decode_loop<D>(buf, m, y + i);
  }
}

// Calls v.template run<Grid-or-void, D>() for the spec's codec and the dtype.
template <class V>
void dispatch(const CodecSpec& spec, DType dtype, V&& v) {
  auto by_dtype = [&](auto grid_tag) {
    using G = typename decltype(grid_tag)::type;
    switch (dtype) {
      case DType::Float32: return v.template run<G, DType::Float32>();
      case DType::Float16: return v.template run<G, DType::Float16>();
      case DType::BFloat16: return v.template run<G, DType::BFloat16>();
      default: throw std::invalid_argument(std::string("dtype: compression codes float32, float16 and bfloat16, not ") + dtype_name(dtype));
    }
  };
  switch (spec.kind) {
    case CodecKind::BF16: return by_dtype(std::common_type<void>{});
    case CodecKind::FP8E4M3: return by_dtype(std::common_type<kern::E4M3Grid>{});
    case CodecKind::FP8E5M2: return by_dtype(std::common_type<kern::E5M2Grid>{});
    case CodecKind::Int8: return by_dtype(std::common_type<kern::Int8Grid>{});
    case CodecKind::Int4: return by_dtype(std::common_type<kern::Int4Grid>{});
    default: throw std::invalid_argument("compress: no codec given");
  }
}

struct Encoder {
  const CodecSpec& spec;
  const void* src;
  size_t n;
  uint8_t* dst;
  uint64_t base;
  template <class G, DType D>
  void run() {
    if constexpr (std::is_void<G>::value)
      encode_bf16<D>(spec, src, n, dst, base);
    else
      encode_scaled<G, D>(spec, src, n, dst, base);
  }
};

struct Decoder {
  const CodecSpec& spec;
  const uint8_t* src;
  size_t n;
  void* dst;
  template <class G, DType D>
  void run() {
    if constexpr (std::is_void<G>::value)
      decode_bf16<D>(src, n, dst);
    else
      decode_scaled<G, D>(spec, src, n, dst);
  }
};

}  // namespace

kern::CodecKind codec_kind(const std::string& name) {
  for (CodecKind k : {CodecKind::BF16, CodecKind::FP8E4M3, CodecKind::FP8E5M2, CodecKind::Int8, CodecKind::Int4})
    if (name == codec_name(k)) return k;
  throw std::invalid_argument("compress: unknown codec '" + name + "' (bf16, fp8_e4m3, fp8_e5m2, int8, int4)");
}

const char* codec_name(kern::CodecKind kind) {
  switch (kind) {
    case CodecKind::BF16: return "bf16";
    case CodecKind::FP8E4M3: return "fp8_e4m3";
    case CodecKind::FP8E5M2: return "fp8_e5m2";
    case CodecKind::Int8: return "int8";
    case CodecKind::Int4: return "int4";
    default: return "none";
  }
}

int32_t codec_desc_tag(const CodecSpec& spec) {
  if (!spec.active()) return 0;
  uint64_t z = static_cast<uint64_t>(spec.block) * 0x9E3779B97F4A7C15ull + (spec.stochastic ? spec.seed : 0) +
               static_cast<uint64_t>(spec.piece_bytes) * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finaliser
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const uint32_t tag = static_cast<uint32_t>(spec.kind) | (spec.stochastic ? 8u : 0u) | (spec.inter_only ? 16u : 0u) |
                       (static_cast<uint32_t>(z & 0x3FFFFFF) << 5);
  return static_cast<int32_t>(tag);
}

std::string codec_tag_text(int32_t tag) {
  if (tag == 0) return "";
  const uint32_t t = static_cast<uint32_t>(tag);
  const unsigned kind = t & 7;
  char hash[16];
  std::snprintf(hash, sizeof hash, "%07x", t >> 5);
  return std::string(kind <= static_cast<unsigned>(CodecKind::Int4) ? codec_name(static_cast<CodecKind>(kind))
                                                                    : "codec code " + std::to_string(kind)) +
         " (" + ((t & 8) ? "stochastic" : "nearest") + ((t & 16) ? ", inter-host only" : "") +
         ", block/piece/seed #" + hash + ")";
}


void codec_encode(const CodecSpec& spec, DType dtype, const void* src, size_t n, uint8_t* dst, uint64_t counter_base) {
  check_codec(spec, dtype);
  dispatch(spec, dtype, Encoder{spec, src, n, dst, counter_base});
}

void codec_decode(const CodecSpec& spec, DType dtype, const uint8_t* src, size_t n, void* dst) {
  check_codec(spec, dtype);
  dispatch(spec, dtype, Decoder{spec, src, n, dst});
}

void codec_encode_project(const CodecSpec& spec, DType dtype, void* x, size_t n, uint8_t* dst, uint64_t counter_base) {
  check_codec(spec, dtype);
  bool coded = false, all = true;
  if (dtype == DType::Float32 && !spec.stochastic && spec.kind == CodecKind::Int8)
    coded = encode_int<kern::Int8Grid, DType::Float32>(spec, x, n, dst, counter_base, static_cast<float*>(x), &all);
  else if (dtype == DType::Float32 && !spec.stochastic && spec.kind == CodecKind::Int4)
    coded = encode_int<kern::Int4Grid, DType::Float32>(spec, x, n, dst, counter_base, static_cast<float*>(x), &all);
  if (coded && all) return;
  if (!coded) codec_encode(spec, dtype, x, n, dst, counter_base);
  codec_decode(spec, dtype, dst, n, x);  // (a block projected above decodes to the same values)
}

}  // namespace commlib
