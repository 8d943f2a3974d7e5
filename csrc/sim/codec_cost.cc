// Default codec compute rates of the simulator (codec_cost.h).
#include "sim/codec_cost.h"

#include <stdexcept>
#include <string>

namespace commlib {
namespace sim {

CodecCost codec_cost(const CodecSpec& spec, double encode_ns, double decode_ns) {
  CodecCost c;
  c.spec = spec;
  if (!spec.active()) return c;
  // ns per float32 element of kernels/cpu_codecs.cc at -O3 (docs/compression.md "Cost": about
  // 1-3 ns): bf16 is a bit cut, the scaled codecs find a block's amax, then round each element.
  const bool bf16 = spec.kind == kern::CodecKind::BF16;
  const double enc = bf16 ? 0.5 : 2.5, dec = bf16 ? 0.3 : 1.0;
  if ((encode_ns >= 0 && !(encode_ns < 1e6)) || (decode_ns >= 0 && !(decode_ns < 1e6)))
    throw std::invalid_argument("codec_ns: per-element times in [0, 1e6) ns");
  c.encode_s = (encode_ns >= 0 ? encode_ns : enc) * 1e-9;
  c.decode_s = (decode_ns >= 0 ? decode_ns : dec) * 1e-9;
  return c;
}

}  // namespace sim
}  // namespace commlib
