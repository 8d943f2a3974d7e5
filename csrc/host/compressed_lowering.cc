// compress= on the host executor (docs/compression.md): the schedule stays as it is; every
// message of a float region travels encoded. A send encodes its region and, before anything
// travels, replaces the sender's own copy with decode(encode(region)), so the sender goes on with
// exactly what its peers receive; a recv decodes into its region; a recv_reduce decodes, reduces
// (in float32 for float16/bfloat16, as every reduction) and projects the result, as a local
// reduce does. Hence the owner of a finished shard holds the same bits as every rank that
// receives it, and a forwarder's re-encoding of decoded values reproduces them (the codecs are
// idempotent): every rank ends bitwise identical. The verifier proves this per schedule with a
// symbolic codec pass (verify/verifier_codec.cc).
//
// Streaming: a message is coded in pieces (CodecSpec::piece_bytes of input, whole blocks), and
// the executor sends each piece's chunk as soon as it is encoded while the next is encoded, and
// hands a received piece to the decoder (and the reduction) while later pieces arrive
// (StepWork). A piece starts on a block edge of its coded segment and numbers its elements for
// stochastic rounding from its offset in the segment, so it codes exactly the values the whole
// segment would: streaming changes no bit of any result (tests/host/test_compressed_streaming.py),
// and the verifier's per-value model covers it unchanged. The pieces lay the message out (their
// encodings one after another), so every rank must use the same piece size: it is part of the
// codec's word in the call descriptor.
#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "host/communicator.h"
#include "kernels/cpu_codecs.h"
#include "kernels/cpu_error_feedback.h"
#include "kernels/cpu_reduce.h"
#include "plan/codec_pieces.h"
#include "plan/lowering.h"

namespace commlib {

namespace {

using Piece = CodecPiece;

}  // namespace

// The codec's side of one step: encodes sends piece by piece, decodes (and reduces) receives
// piece by piece, between the executor's progress passes. Encoded messages only: raw ones
// (inter_only, within a host) are the executor's alone.
class Communicator::CodecStep final : public StepWork {
 public:
  struct Msg {
    const Op* op = nullptr;
    ExecOp* exec = nullptr;
    std::vector<Piece> pieces;
    size_t next = 0;  // send: pieces encoded; receive: pieces consumed
  };

  CodecStep(Communicator& c, const CollectiveCall& call, const CodecSpec& spec, char* const* bases,
            const CallDesc& desc)
      : c_(c), call_(call), spec_(spec), bases_(bases), desc_(desc), esize_(dtype_size(call.dtype)) {}

  char* at(const Region& r) const { return region_address(bases_, r, esize_, desc_, c_.rank_); }

  void decode(const uint8_t* in, const Piece& p, char* dst) const {
    codec_decode(spec_, call_.dtype, in, static_cast<size_t>(p.n), dst + static_cast<size_t>(p.elem) * esize_);
  }
  // dst[p] = decode(encode(dst[p])): a sum is projected where it is made (recv_reduce, reduce), so
  // ranks that compute one sum alike (recursive doubling's exchange) then hold it alike whichever
  // of them sends it on later.
  void project(char* base, const Piece& p) {
    codec_project(spec_, call_.dtype, base + static_cast<size_t>(p.elem) * esize_, static_cast<size_t>(p.n), p.counter,
                  c_.codec_decoded_);
  }
  void project(const Region& r, int64_t piece) {
    codec_pieces(call_, spec_, r, piece, scratch_pieces_);
    for (const Piece& p : scratch_pieces_) project(at(r), p);
  }

  std::vector<Msg>& msgs() { return msgs_; }

  bool run() override {
    // The wire first: a send with less than a piece ready beyond what went gets its next piece.
    for (Msg& m : msgs_)
      if (m.op->kind == OpKind::Send && m.next < m.pieces.size() && m.exec->ready - m.exec->done < m.pieces[m.next].bytes)
        return encode_next(m);
    for (Msg& m : msgs_)
      if (m.op->kind != OpKind::Send && m.next < m.pieces.size() && m.exec->done >= m.pieces[m.next].byte + m.pieces[m.next].bytes)
        return consume_next(m);
    for (Msg& m : msgs_)
      if (m.op->kind == OpKind::Send && m.next < m.pieces.size()) return encode_next(m);
    return false;
  }

 private:
  bool encode_next(Msg& m) {
    const Piece& p = m.pieces[m.next++];
    char* src = at(m.op->src);
    uint8_t* out = c_.codec_msgs_[static_cast<size_t>(m.op - first_op_)].data() + p.byte;
    // the encoding and the sender's projection, in one pass where the codec allows
    codec_encode_project(spec_, call_.dtype, src + static_cast<size_t>(p.elem) * esize_, static_cast<size_t>(p.n), out,
                         p.counter);
    m.exec->ready = m.next == m.pieces.size() ? m.exec->bytes : p.byte + p.bytes;
    return true;
  }

  bool consume_next(Msg& m) {
    const Piece& p = m.pieces[m.next++];
    const Op& op = *m.op;
    const uint8_t* in = c_.codec_msgs_[static_cast<size_t>(m.op - first_op_)].data() + p.byte;
    char* dst = at(op.dst);
    if (op.kind == OpKind::Recv) {
      decode(in, p, dst);
      return true;
    }
    const size_t n = static_cast<size_t>(p.n), off = static_cast<size_t>(p.elem) * esize_;
    if (c_.codec_incoming_.size() < n * esize_) c_.codec_incoming_.resize(n * esize_);
    codec_decode(spec_, call_.dtype, in, n, c_.codec_incoming_.data());
    if (reduces_from_src(op) && at(op.src) != dst) std::memcpy(dst + off, at(op.src) + off, n * esize_);
    reduce_inplace(dst + off, c_.codec_incoming_.data(), n, call_.dtype, call_.op);  // dst = src (op) incoming
    project(dst, p);
    return true;
  }

 public:
  const Op* first_op_ = nullptr;

 private:
  Communicator& c_;
  const CollectiveCall& call_;
  const CodecSpec& spec_;
  char* const* bases_;
  const CallDesc& desc_;
  const size_t esize_;
  std::vector<Msg> msgs_;
  std::vector<Piece> scratch_pieces_;
};

void Communicator::run_compressed_steps(const CollectiveCall& call, const Schedule& sched, const CallDesc& desc,
                                        char* const* bases) {
  const size_t esize = dtype_size(call.dtype);
  const CodecSpec spec = call_codec(call.codec, desc);
  const int64_t piece = codec_piece_elements(spec, esize);
  // A chunk carries at most one piece's encoding, so the wire gets each piece as it is encoded
  // (every rank computes the same cap: the piece size is in the descriptor).
  if (piece) exec_.set_chunk_cap(std::max<size_t>(64, codec_encoded_bytes(spec, static_cast<size_t>(piece))));
  CodecStep cs(*this, call, spec, bases, desc);
  // compress_inter_only: a message between ranks of one host travels raw (the sender keeps its
  // value, the receiver gets it exactly, no codec work on either end), and a sum made from a raw
  // message is not projected, so intra-host phases stay exact (on one host the call is exact). A
  // value crosses hosts only encoded, and both ends hold it projected from then on. all_gather's
  // blocks are sent raw to some peers and encoded to others, so across hosts each rank projects
  // its own block before anything travels. The verifier proves this per schedule and host map
  // (verifier_codec.cc); what it does not prove is refused (commlib/core/codecs.py).
  const std::vector<int>& host_of = topology_.host_of;
  auto coded = [&](int peer) {
    return !spec.inter_only || host_of.empty() || host_of[static_cast<size_t>(peer)] != host_of[static_cast<size_t>(rank_)];
  };
  const bool hosts = !host_of.empty() && std::any_of(host_of.begin(), host_of.end(), [&](int h) { return h != host_of[0]; });
  if (spec.inter_only && hosts && call.coll == Collective::AllGather && call.count)
    cs.project(Region{BufferId::Input, 0, call.count}, piece);
  for (const Step& step : sched.steps) {
    ops_.clear();
    std::vector<CodecStep::Msg>& msgs = cs.msgs();
    msgs.clear();
    cs.first_op_ = step.ops.data();
    if (codec_msgs_.size() < step.ops.size()) codec_msgs_.resize(step.ops.size());
    ops_.reserve(step.ops.size());  // msgs point into ops_: no reallocation below
    for (size_t i = 0; i < step.ops.size(); ++i) {
      const Op& op = step.ops[i];
      if (op.kind == OpKind::Copy || op.kind == OpKind::Reduce) continue;
      if (op.kind != OpKind::Send && op.kind != OpKind::Recv && op.kind != OpKind::RecvReduce)
        throw CommError(std::string("compress: the schedule uses ") + op_kind_name(op.kind) +
                        ", which compress= does not lower (commlib.codecs.verify refuses such schedules)");
      const Region& r = op.kind == OpKind::Send ? op.src : op.dst;
      const bool code = coded(op.peer);
      std::vector<uint8_t>& buf = codec_msgs_[i];
      ExecOp e;
      e.kind = op.kind == OpKind::Send ? OpKind::Send : OpKind::Recv;
      e.peer = op.peer;
      e.desc = desc;
      CodecStep::Msg m;
      m.op = &op;
      if (!code) {  // raw: the region's bytes as they are
        e.bytes = static_cast<size_t>(r.count) * esize;
        if (op.kind == OpKind::Send) {
          e.src = cs.at(r);
        } else if (op.kind == OpKind::Recv) {
          e.dst = cs.at(r);
        } else {  // the executor reduces each chunk straight from the link, as uncompressed calls do
          e.kind = OpKind::RecvReduce;
          e.dst = cs.at(r);
          e.src = reduces_from_src(op) ? cs.at(op.src) : nullptr;
        }
      } else {
        codec_pieces(call, spec, r, piece, m.pieces);
        buf.resize(codec_pieces_bytes(m.pieces));
        e.bytes = buf.size();
        if (op.kind == OpKind::Send) {
          e.src = reinterpret_cast<const char*>(buf.data());
          e.ready = 0;  // CodecStep encodes it piece by piece
        } else {
          e.dst = reinterpret_cast<char*>(buf.data());
        }
      }
      ops_.push_back(e);
      if (!m.pieces.empty() && code) {
        m.exec = &ops_.back();
        msgs.push_back(std::move(m));
      }
    }
    // The call's dtype and op: the executor reduces the raw recv_reduce messages (inter_only's
    // intra-host phases) as they arrive, with no staging copy; encoded messages are plain byte
    // transfers to it (every rank cuts chunks alike: same call, same element size).
    exec_.run_step(ops_, call.dtype, call.op, desc, &cs);
    // The step's ops are independent (the verifier's rule), so the local ones may follow the
    // transfers in any order.
    for (const Op& op : step.ops) {
      const size_t n = static_cast<size_t>(op.dst.count);
      if (!n) continue;
      if (op.kind == OpKind::Copy) {
        std::memmove(cs.at(op.dst), cs.at(op.src), n * esize);
      } else if (op.kind == OpKind::Reduce) {
        reduce_inplace(cs.at(op.dst), cs.at(op.src), n, call.dtype, call.op);
        if (!spec.inter_only) cs.project(op.dst, piece);  // inter_only: its operands are as they came
      }
    }
  }
}

}  // namespace commlib
