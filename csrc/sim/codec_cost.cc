// Default codec compute rates of the simulator (codec_cost.h).
#include "sim/codec_cost.h"

#include <stdexcept>
#include <string>

namespace commlib {
namespace sim {

// Measured by bench/codec_rates.py (process time per element, 4 Mi float32 elements, block 32,
// median of 3; bench/RESULTS_compression.md and docs/compression.md "Cost"): the integer grids
// after session 20's closed-form scale and AVX2 entries (RESULTS_compression "Session 20", item 2,
// load 14-15: int8 encode 0.49, int4 0.41, decode 0.19, error feedback's pass int8 0.87, int4
// 0.82); fp8 and bf16 from session 16's table ("the codecs' CPU cost": fp8_e4m3 2.02 / 0.60,
// fp8_e5m2 1.97 / 0.71, bf16 1.50 / 0.22), unchanged since. They were 2.5 / 1.0 (scaled codecs)
// and 1.2 / 0.3 (int8, int4) before session 21: the scalar and SSE2 loops' rates.
CodecRates default_codec_rates(const std::string& codec) {
  if (codec == "int8") return {0.49, 0.19};
  if (codec == "int4") return {0.41, 0.19};
  if (codec == "fp8_e4m3") return {2.02, 0.60};
  if (codec == "fp8_e5m2") return {1.97, 0.71};
  if (codec == "bf16") return {1.50, 0.22};
  throw std::invalid_argument("compress: unknown codec '" + codec + "' (bf16, fp8_e4m3, fp8_e5m2, int8, int4)");
}

double default_feedback_ns() { return 0.85; }  // int8 0.87, int4 0.82 (as above)

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
  // ns per float32 element when the caller gives none: the rates of the codec of this layout (a
  // codec without scales is bf16; with scales, int4 at 4 bits a code and int8 at 8, fp8's layout too).
  const CodecRates rates = default_codec_rates(scale_bytes == 0 ? "bf16" : code_bits == 4 ? "int4" : "int8");
  c.encode_s = (encode_ns >= 0 ? encode_ns : rates.encode_ns) * 1e-9;
  c.decode_s = (decode_ns >= 0 ? decode_ns : rates.decode_ns) * 1e-9;
  return c;
}

}  // namespace sim
}  // namespace commlib
