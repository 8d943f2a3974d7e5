#include "plan/codec_pieces.h"

#include <algorithm>

namespace commlib {

CodecSpec call_codec(const CodecSpec& spec, const CallDesc& desc) {
  CodecSpec s = spec;
  s.seed += desc.seq * 0x9E3779B97F4A7C15ull;
  return s;
}

int64_t codec_piece_elements(const CodecSpec& spec, size_t esize) {
  const int64_t block = spec.kind == kern::CodecKind::BF16 ? 1 : spec.block;
  return spec.piece_bytes > 0 ? std::max<int64_t>(1, spec.piece_bytes / static_cast<int64_t>(esize) / block) * block : 0;
}

void codec_pieces(const CollectiveCall& call, const CodecSpec& spec, const Region& r, int64_t piece,
                  std::vector<CodecPiece>& out) {
  out.clear();
  size_t byte = 0;
  auto segment = [&](int64_t pos, int64_t n) {
    for (int64_t k = 0; k < n || (n == 0 && k == 0); k += piece ? piece : std::max<int64_t>(n, 1)) {
      const int64_t m = piece ? std::min(piece, n - k) : n;
      const size_t bytes = codec_encoded_bytes(spec, static_cast<size_t>(m));
      out.push_back(CodecPiece{pos + k, m, static_cast<uint64_t>(k), byte, bytes});
      byte += bytes;
      if (n == 0) break;
    }
  };
  if (call.coll != Collective::AllGather || call.count == 0 || r.count == 0) return segment(0, r.count);
  for (int64_t pos = 0; pos < r.count;) {
    const int64_t block_end = ((r.offset + pos) / call.count + 1) * call.count;
    const int64_t n = std::min(r.count - pos, block_end - (r.offset + pos));
    segment(pos, n);
    pos += n;
  }
}

}  // namespace commlib
