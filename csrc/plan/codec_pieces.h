// How a call with compress= lays out its encoded messages, for every engine that lowers one (the
// host executor's host/compressed_lowering.cc, the stream engine's stream/copy_path_codec.cc): the
// codec of the call (its seed advanced per call), a message's coded segments and pieces, so both
// engines code the same values at the same places and end with the same bits (docs/compression.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/codec_spec.h"
#include "plan/call.h"
#include "schedule/ir.h"
#include "transport/transport.h"

namespace commlib {

// One coded piece of a message: `n` elements at `elem` of the op's region, numbered from `counter`
// for stochastic rounding, encoded at `byte` of the message.
struct CodecPiece {
  int64_t elem, n;
  uint64_t counter;
  size_t byte, bytes;
};

// The codec a call runs: the call's, its seed advanced by the call's number, a fresh reproducible
// stream per call. Stochastic rounding numbers an element by its place in its segment (and hashes
// its value, codecs.h sr_draw), not by buffer, offset or step: ranks that project one sum in
// differently placed regions (direct all_reduce: output on one rank, scratch on another) draw alike.
CodecSpec call_codec(const CodecSpec& spec, const CallDesc& desc);

// Elements of a piece (CodecSpec::piece_bytes of input rounded down to whole blocks; 0: whole).
int64_t codec_piece_elements(const CodecSpec& spec, size_t esize);

// A message's coded segments: all_gather's split where the ranks' blocks meet (multiples of count
// in every buffer), so a block is always coded on its own, alike wherever it travels; the
// others' whole. Each segment is cut into pieces of `piece` elements (0: whole).
void codec_pieces(const CollectiveCall& call, const CodecSpec& spec, const Region& r, int64_t piece,
                  std::vector<CodecPiece>& out);

// The encoded bytes of a message of these pieces.
inline size_t codec_pieces_bytes(const std::vector<CodecPiece>& ps) {
  return ps.empty() ? 0 : ps.back().byte + ps.back().bytes;
}

}  // namespace commlib
