// compress= in the simulator (docs/compression.md, docs/simulator.md): what a message costs when it
// travels encoded, as host/compressed_lowering.cc runs it. The sender encodes the whole message and
// projects its own copy (encode + decode) before the step's transfers start; the wire carries the
// encoded bytes; the receiver decodes after the transfer (no chunk pipeline: a coded message does
// not stream), and a reducing receive then reduces the decoded values and projects the sum.
// inter_only: messages within a host are raw and cost what they always do.
#pragma once

#include <cstdint>

#include "kernels/cpu_codecs.h"

namespace commlib {
namespace sim {

struct CodecCost {
  CodecSpec spec;            // kind None: no codec
  double encode_s = 0;       // per element (CPU, one core)
  double decode_s = 0;       // per element
  bool coded(int host_s, int host_q) const { return spec.active() && (!spec.inter_only || host_s != host_q); }
  double bytes(int64_t count, int elem_bytes, bool coded) const {
    return coded ? static_cast<double>(codec_encoded_bytes(spec, static_cast<size_t>(count)))
                 : static_cast<double>(count) * elem_bytes;
  }
  double sender_s(int64_t count) const { return static_cast<double>(count) * (encode_s + decode_s); }
  // After the last byte is in: decode; a reducing receive also reduces and projects.
  double receiver_s(int64_t count, bool reduces, double reduce_s_per_byte, int elem_bytes) const {
    const double n = static_cast<double>(count);
    return n * decode_s + (reduces ? n * elem_bytes * reduce_s_per_byte + n * (encode_s + decode_s) : 0.0);
  }
};

// The codec's cost with per-element times in nanoseconds; a negative time takes the codec's
// default (codec_cost.cc: the CPU loops' rates on one core of a quiet machine).
CodecCost codec_cost(const CodecSpec& spec, double encode_ns = -1, double decode_ns = -1);

}  // namespace sim
}  // namespace commlib
