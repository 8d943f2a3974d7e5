// compress= on the host executor (docs/compression.md): the schedule stays as it is; every
// message of a float region travels encoded. A send encodes its region and, before anything
// travels, replaces the sender's own copy with decode(encode(region)), so the sender goes on with
// exactly what its peers receive; a recv decodes into its region; a recv_reduce decodes, reduces
// (in float32 for float16/bfloat16, as every reduction) and projects the result, as a local
// reduce does. Hence the owner of a finished
// shard holds the same bits as every rank that receives it, and a forwarder's re-encoding of
// decoded values reproduces them (the codecs are idempotent): every rank ends bitwise identical.
// The verifier proves this per schedule with a symbolic codec pass (verify/verifier_codec.cc).
//
// Messages are encoded whole before the step's transfers start, so a message no longer streams
// while the peer reduces (the uncompressed path's overlap): a later increment may encode chunk by
// chunk.
#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "host/communicator.h"
#include "kernels/cpu_codecs.h"
#include "kernels/cpu_reduce.h"
#include "plan/lowering.h"

namespace commlib {

namespace {

// A message's coded pieces: all_gather's split where the ranks' blocks meet (multiples of count
// in every buffer), so a block is always coded on its own, alike wherever it travels; the
// others' whole. f(offset in the region, elements).
template <class F>
void for_each_piece(const CollectiveCall& call, const Region& r, F&& f) {
  if (call.coll != Collective::AllGather || call.count == 0) {
    f(int64_t{0}, r.count);
    return;
  }
  for (int64_t pos = 0; pos < r.count;) {
    const int64_t block_end = ((r.offset + pos) / call.count + 1) * call.count;
    const int64_t n = std::min(r.count - pos, block_end - (r.offset + pos));
    f(pos, n);
    pos += n;
  }
}

}  // namespace

void Communicator::run_compressed_steps(const CollectiveCall& call, const Schedule& sched, const CallDesc& desc,
                                        char* const* bases) {
  const size_t esize = dtype_size(call.dtype);
  CodecSpec spec = call.codec;
  spec.seed += desc.seq * 0x9E3779B97F4A7C15ull;  // a fresh, reproducible stream per call
  auto at = [&](const Region& r) { return region_address(bases, r, esize, desc, rank_); };
  // Stochastic rounding numbers an element by its place in its piece (and hashes its value,
  // codecs.h sr_draw), not by buffer, offset or step: ranks that project one sum in differently
  // placed regions (direct all_reduce: output on one rank, scratch on another) draw alike.
  auto coded_bytes = [&](const Region& r) {
    size_t bytes = 0;
    for_each_piece(call, r, [&](int64_t, int64_t n) { bytes += codec_encoded_bytes(spec, static_cast<size_t>(n)); });
    return bytes;
  };
  auto encode = [&](const char* src, const Region& r, uint8_t* out) {
    for_each_piece(call, r, [&](int64_t pos, int64_t n) {
      codec_encode(spec, call.dtype, src + static_cast<size_t>(pos) * esize, static_cast<size_t>(n), out, 0);
      out += codec_encoded_bytes(spec, static_cast<size_t>(n));
    });
  };
  auto decode = [&](const uint8_t* in, const Region& r, char* dst) {
    for_each_piece(call, r, [&](int64_t pos, int64_t n) {
      codec_decode(spec, call.dtype, in, static_cast<size_t>(n), dst + static_cast<size_t>(pos) * esize);
      in += codec_encoded_bytes(spec, static_cast<size_t>(n));
    });
  };
  // A sum is projected where it is made (recv_reduce, reduce): ranks that compute one sum alike
  // (recursive doubling's exchange) then hold it alike whichever of them sends it on later.
  auto project = [&](const Region& r) {
    const size_t bytes = coded_bytes(r);
    if (codec_decoded_.size() < bytes) codec_decoded_.resize(bytes);
    uint8_t* tmp = reinterpret_cast<uint8_t*>(codec_decoded_.data());
    encode(at(r), r, tmp);
    decode(tmp, r, at(r));
  };
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
    project(Region{BufferId::Input, 0, call.count});
  for (const Step& step : sched.steps) {
    ops_.clear();
    if (codec_msgs_.size() < step.ops.size()) codec_msgs_.resize(step.ops.size());
    for (size_t i = 0; i < step.ops.size(); ++i) {
      const Op& op = step.ops[i];
      if (op.kind == OpKind::Copy || op.kind == OpKind::Reduce) continue;
      if (op.kind != OpKind::Send && op.kind != OpKind::Recv && op.kind != OpKind::RecvReduce)
        throw CommError(std::string("compress: the schedule uses ") + op_kind_name(op.kind) +
                        ", which compress= does not lower (commlib.codecs.verify refuses such schedules)");
      const Region& r = op.kind == OpKind::Send ? op.src : op.dst;
      const bool code = coded(op.peer);
      std::vector<uint8_t>& msg = codec_msgs_[i];
      ExecOp e;
      e.kind = op.kind == OpKind::Send ? OpKind::Send : OpKind::Recv;
      e.peer = op.peer;
      e.desc = desc;
      if (!code) {  // raw: the region's bytes as they are
        e.bytes = static_cast<size_t>(r.count) * esize;
        if (op.kind == OpKind::Send) {
          e.src = at(op.src);
        } else if (op.kind == OpKind::Recv) {
          e.dst = at(op.dst);
        } else {
          msg.resize(e.bytes);
          e.dst = reinterpret_cast<char*>(msg.data());
        }
        ops_.push_back(e);
        continue;
      }
      msg.resize(coded_bytes(r));
      e.bytes = msg.size();
      if (op.kind == OpKind::Send) {
        char* src = at(op.src);
        encode(src, r, msg.data());
        decode(msg.data(), r, src);  // the sender's projection
        e.src = reinterpret_cast<const char*>(msg.data());
      } else {
        e.dst = reinterpret_cast<char*>(msg.data());
      }
      ops_.push_back(e);
    }
    exec_.run_step(ops_, DType::UInt8, RedOp::Sum, desc);
    // The step's ops are independent (the verifier's rule), so the local ones and the decoding
    // may follow the transfers in any order.
    for (size_t i = 0; i < step.ops.size(); ++i) {
      const Op& op = step.ops[i];
      const size_t n = static_cast<size_t>(op.dst.count);
      switch (op.kind) {
        default:  // Send (the others were refused above)
          break;
        case OpKind::Copy:
          if (n) std::memmove(at(op.dst), at(op.src), n * esize);
          break;
        case OpKind::Reduce:
          if (!n) break;
          reduce_inplace(at(op.dst), at(op.src), n, call.dtype, call.op);
          if (!spec.inter_only) project(op.dst);  // inter_only: its operands are as they came
          break;
        case OpKind::Recv:
          if (n && coded(op.peer)) decode(codec_msgs_[i].data(), op.dst, at(op.dst));
          break;
        case OpKind::RecvReduce: {
          if (!n) break;
          const bool code = coded(op.peer);
          const char* incoming = reinterpret_cast<const char*>(codec_msgs_[i].data());
          if (code) {
            if (codec_decoded_.size() < n * esize) codec_decoded_.resize(n * esize);
            decode(codec_msgs_[i].data(), op.dst, codec_decoded_.data());
            incoming = codec_decoded_.data();
          }
          char* dst = at(op.dst);
          if (reduces_from_src(op) && at(op.src) != dst) std::memcpy(dst, at(op.src), n * esize);
          reduce_inplace(dst, incoming, n, call.dtype, call.op);  // dst = src (op) incoming
          if (code) project(op.dst);
          break;
        }
      }
    }
  }
}

}  // namespace commlib
