#include "plan/lowering.h"

#include "common/shapes.h"
#include "common/errors.h"
#include "plan/describe.h"

namespace commlib {

CallDesc call_desc(const CollectiveCall& call, uint8_t algo, uint64_t seq) {
  CallDesc desc;
  desc.coll = static_cast<uint8_t>(call.coll);
  desc.dtype = static_cast<uint8_t>(call.dtype);
  desc.op = collective_reduces(call.coll) ? static_cast<uint8_t>(call.op) : 0;
  desc.algo = algo;
  // compress= applies to rootless collectives only: their root word carries the codec, so ranks
  // that pass different codecs meet in a mismatch (describe.cc names compress=).
  desc.root = collective_has_root(call.coll) ? call.root : codec_desc_tag(call.codec);
  desc.count = call.count;
  desc.seq = seq;
  return desc;
}

InputStaging input_staging(const CollectiveCall& call, int rank, int size) {
  InputStaging s;
  const bool premul = call.op == RedOp::PremulSum && collective_reduces(call.coll);
  const bool codec = call.codec.active() && call.input != call.output;
  // (the shapes only where a branch needs them: most calls need none)
  const int64_t input = premul || codec ? buffer_shapes(call.coll, call.count, size, rank, call.root).input : 0;  // < 0: no input
  if (premul && input >= 0) {
    s.kind = InputStaging::Scale;
    s.elements = static_cast<size_t>(input);
  } else if (call.coll == Collective::AllToAll && call.input == call.output && call.count) {
    s.kind = InputStaging::Copy;
    s.elements = static_cast<size_t>(call.count) * size;
  } else if (codec && input > 0) {
    // compress=: a sender keeps what it sent as decoded (its projection, docs/compression.md), so
    // it needs its own copy of an input it may not write.
    s.kind = InputStaging::Copy;
    s.elements = static_cast<size_t>(input);
  }
  return s;
}

bool avg_divides(const CollectiveCall& call, int rank) {
  return call.op == RedOp::Avg && collective_reduces(call.coll) && (call.coll != Collective::Reduce || rank == call.root);
}

bool failed_peer_error(const CallDesc& desc, int rank, int size, const std::function<PeerStatus(int)>& status,
                       ErrorKind* kind, std::string* message) {
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const PeerStatus st = status(p);
    if (st.state != PeerState::Failed) continue;
    *kind = st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind;
    *message = "rank " + std::to_string(rank) + " cannot start " + describe_call(desc) + ": rank " + std::to_string(p) +
               " failed earlier: " + st.message;
    return true;
  }
  return false;
}

char* region_address(char* const* bases, const Region& r, size_t esize, const CallDesc& desc, int rank,
                     const std::string& algo) {
  if (!bases[static_cast<int>(r.buf)]) {
    if (r.count == 0) return nullptr;
    throw CommError("internal error: " + (algo.empty() ? "" : algo + " ") + "schedule of " + describe_call(desc) +
                    " on rank " + std::to_string(rank) + " uses the " + buffer_name(r.buf) +
                    " buffer, which this rank does not have");
  }
  return region_start(bases, r, static_cast<int64_t>(esize));
}

}  // namespace commlib
