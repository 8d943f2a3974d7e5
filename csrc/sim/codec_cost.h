// compress= in the simulator (docs/compression.md, docs/simulator.md): what a message costs when it
// travels encoded, as host/compressed_lowering.cc runs it. The sender encodes the whole message and
// projects its own copy (encode + decode); the wire carries the encoded bytes; the receiver
// decodes, and a reducing receive reduces the decoded values and projects the sum. With `piece`
// (streaming, COMMLIB_COMPRESS_PIECE_BYTES) that work overlaps the wire: the transfer starts once
// the first piece is encoded and ends no earlier than the sender's whole encoding plus one piece
// on the wire; the receiver's work ends no earlier than the last piece's share after the last
// byte, nor than all of it from the first piece's arrival or after its own encoding (one CPU). A
// message of at most one piece (or piece 0) is coded whole: encoded before the transfer starts,
// decoded after the last byte.
// inter_only: messages within a host are raw and cost what they always do. The codec's layout
// (scale bytes per block, bits per code) comes from the caller (the bindings read it off the
// codecs of kernels/, which the simulator does not include: they share a floor).
#pragma once

#include <cstdint>
#include <string>

namespace commlib {
namespace sim {

struct CodecCost {
  bool active = false;       // no codec: every message raw
  bool inter_only = false;   // compress_inter_only
  int64_t block = 32;        // elements per scale
  int scale_bytes = 1;       // per block (0: no scales, bf16)
  int code_bits = 8;         // per element
  double encode_s = 0;       // per element (CPU, one core)
  double decode_s = 0;       // per element
  int64_t piece = 0;         // elements per streamed piece (0: whole messages)
  // Seconds of one core each rank spends before the collective: error feedback's pass over its
  // input (DataParallel(error_feedback=True), the DDP hook: kernels/cpu_error_feedback.cc); 0: none.
  double prelude_s = 0;
  bool coded(int host_s, int host_q) const { return active && (!inter_only || host_s != host_q); }
  // The piece a coded message of `count` elements streams in; 0: coded whole.
  int64_t streamed_piece(bool is_coded, int64_t count) const { return is_coded && piece > 0 && count > piece ? piece : 0; }
  double bytes(int64_t count, int elem_bytes, bool coded) const {
    if (!coded) return static_cast<double>(count) * elem_bytes;
    return static_cast<double>((count + block - 1) / block * scale_bytes + (count * code_bits + 7) / 8);
  }
  double sender_s(int64_t count) const { return static_cast<double>(count) * (encode_s + decode_s); }
  // After the last byte is in: decode; a reducing receive also reduces and projects.
  double receiver_s(int64_t count, bool reduces, double reduce_s_per_byte, int elem_bytes) const {
    const double n = static_cast<double>(count);
    return n * decode_s + (reduces ? n * elem_bytes * reduce_s_per_byte + n * (encode_s + decode_s) : 0.0);
  }
};

// The simulator's default rates: CPU ns per float32 element of the codec loops on one core, nearest
// rounding (measured: codec_cost.cc says where), by codec name (bf16, fp8_e4m3, fp8_e5m2, int8,
// int4; std::invalid_argument naming compress otherwise), and error feedback's fused pass.
struct CodecRates {
  double encode_ns;
  double decode_ns;
};
CodecRates default_codec_rates(const std::string& codec);
double default_feedback_ns();

// A codec's cost: its layout (scale_bytes per block of `block` elements, code_bits per element),
// and per-element times in nanoseconds, a negative one taking the default of the codec of that
// layout (default_codec_rates: int8's or int4's with scales, bf16's without; a caller with an fp8
// codec passes its rates). Throws std::invalid_argument naming the argument.
CodecCost codec_cost(int64_t block, int scale_bytes, int code_bits, bool inter_only, double encode_ns = -1,
                     double decode_ns = -1, int64_t piece = 0);

}  // namespace sim
}  // namespace commlib
