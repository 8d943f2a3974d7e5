// Default codec compute rates of the simulator (codec_cost.h).
#include "sim/codec_cost.h"

#include <stdexcept>
#include <string>

namespace commlib {
namespace sim {

CodecCost codec_cost(int64_t block, int scale_bytes, int code_bits, bool inter_only, double encode_ns,
                     double decode_ns, int64_t piece) {
  if (block < 1) throw std::invalid_argument("block: must be >= 1, got " + std::to_string(block));
  if (scale_bytes < 0 || code_bits < 1)
    throw std::invalid_argument("codec: scale_bytes >= 0 and code_bits >= 1");
  if ((encode_ns >= 0 && !(encode_ns < 1e6)) || (decode_ns >= 0 && !(decode_ns < 1e6)))
    throw std::invalid_argument("codec_ns: per-element times in [0, 1e6) ns");
  if (piece < 0) throw std::invalid_argument("piece: elements per streamed piece must be >= 0, got " + std::to_string(piece));
  CodecCost c;
  c.piece = piece;
  c.active = true;
  c.inter_only = inter_only;
  c.block = block;
  c.scale_bytes = scale_bytes;
  c.code_bits = code_bits;
  // ns per float32 element when the caller gives none (the bindings pass each codec's measured
  // rates, docs/compression.md "Cost"): a codec without scales (bf16) only cuts bits; the scaled
  // ones find a block's amax, then round each element.
  const bool scaled = scale_bytes > 0;
  c.encode_s = (encode_ns >= 0 ? encode_ns : scaled ? 2.5 : 0.5) * 1e-9;
  c.decode_s = (decode_ns >= 0 ? decode_ns : scaled ? 1.0 : 0.3) * 1e-9;
  return c;
}

}  // namespace sim
}  // namespace commlib
