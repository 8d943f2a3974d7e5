// compress= on the copy path (docs/compression.md "On device buffers (the stream engine)"): the
// host executor's compressed lowering (host/compressed_lowering.cc) step for step, with the codecs
// as device kernels (Device::codec_encode / codec_decode, kernels/codec_kernel.h) on the call's
// stream. Per step: a local copy copies; a local reduce reduces and projects its sum; a send
// encodes its region into the step's staging memory and projects the sender's copy (decodes the
// bytes back over it), then its encoded bytes go through the peer's inbox in chunks as any
// message's do (peers over the nccl link: in the step's NCCL group, as byte messages); a receive takes the encoded bytes into staging, then decodes them into its region,
// or (recv_reduce) into a temporary it reduces into the region and projects the sum. Segments,
// stochastic counters and the per-call seed are the host's (plan/codec_pieces.h), so every value is
// coded as the host codes it and the results equal the host engine's bit for bit. Every codec
// operation is gated on the stop word like the path's other data operations. The call runs on the
// caller's stream (no fork onto the send and receive streams: a step's decodes wait for its
// messages anyway). A step's local operations run after its messages, as on the host: a send's
// projection changes the region it sends, which a copy of the same step may read.
#include <algorithm>

#include "plan/codec_pieces.h"
#include "plan/lowering.h"
#include "stream/copy_path.h"

namespace commlib {
namespace {

size_t aligned(size_t bytes) { return (bytes + 15) / 16 * 16; }

}  // namespace

void CopyPath::project_region(const CodecSpec& spec, DType dtype, char* base, const std::vector<CodecPiece>& pieces,
                              char* tmp, DeviceStream& s) {
  const size_t esize = dtype_size(dtype);
  for (const CodecPiece& p : pieces) {
    if (!p.n) continue;
    char* x = base + static_cast<size_t>(p.elem) * esize;
    device_->codec_encode(gate(s), spec, dtype, x, static_cast<size_t>(p.n), tmp, p.counter, s);
    device_->codec_decode(gate(s), spec, dtype, tmp, static_cast<size_t>(p.n), x, s);
  }
}

Launched CopyPath::enqueue_compressed(const PathCall& pc, DeviceStream& s) {
  const CollectiveCall& call = pc.call;
  const DType dtype = call.dtype;
  const size_t esize = dtype_size(dtype);
  const CodecSpec spec = call_codec(call.codec, pc.desc);
  auto resolve = [&](const Region& r) { return region_address(pc.bases, r, esize, pc.desc, rank_); };
  std::vector<CodecPiece> pieces;
  for (const Step& step : pc.plan.sched.steps) {
    // The step's staging: per message its encoded bytes (a recv_reduce also its decoded values),
    // and one projection temporary as large as the largest region the step projects.
    std::vector<size_t> at(step.ops.size());
    size_t total = 0, project_bytes = 0;
    for (size_t i = 0; i < step.ops.size(); ++i) {
      const Op& o = step.ops[i];
      if (o.kind == OpKind::Copy) continue;
      const Region& r = o.kind == OpKind::Send ? o.src : o.dst;
      codec_pieces(call, spec, r, 0, pieces);
      const size_t bytes = codec_pieces_bytes(pieces);
      if (o.kind == OpKind::Reduce || o.kind == OpKind::RecvReduce) project_bytes = std::max(project_bytes, bytes);
      if (o.kind == OpKind::Reduce) continue;
      at[i] = total;
      total += aligned(bytes) + (o.kind == OpKind::RecvReduce ? aligned(static_cast<size_t>(r.count) * esize) : 0);
    }
    char* stage = total + project_bytes ? static_cast<char*>(device_->allocate_ordered(total + project_bytes, s)) : nullptr;
    char* tmp = stage ? stage + total : nullptr;
    for (size_t i = 0; i < step.ops.size(); ++i) {  // encode and project every send's region
      const Op& o = step.ops[i];
      if (o.kind != OpKind::Send || !o.src.count) continue;
      char* x = resolve(o.src);
      codec_pieces(call, spec, o.src, 0, pieces);
      for (const CodecPiece& p : pieces) {
        char* v = x + static_cast<size_t>(p.elem) * esize;
        device_->codec_encode(gate(s), spec, dtype, v, static_cast<size_t>(p.n), stage + at[i] + p.byte, p.counter, s);
        device_->codec_decode(gate(s), spec, dtype, stage + at[i] + p.byte, static_cast<size_t>(p.n), v, s);
      }
    }
    // The encoded bytes in chunks: chunk k of every send, then of every receive (copy_path.h).
    auto bytes_of = [&](const Op& o) {
      codec_pieces(call, spec, o.kind == OpKind::Send ? o.src : o.dst, 0, pieces);
      return codec_pieces_bytes(pieces);
    };
    const size_t chunk = slot_bytes_;
    auto chunks = [&](size_t bytes) { return bytes ? (bytes + chunk - 1) / chunk : 1; };
    std::vector<size_t> msg_bytes(step.ops.size());
    size_t rounds = 0;
    for (size_t i = 0; i < step.ops.size(); ++i) {
      const Op& o = step.ops[i];
      if (o.kind != OpKind::Send && o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce) continue;
      msg_bytes[i] = bytes_of(o);
      rounds = std::max(rounds, chunks(msg_bytes[i]));
    }
    if (nccl_.carries_any()) {  // peers over the nccl link: the encoded bytes as one NCCL group
      Step bytes_step;  // each message as a byte region naming its op, resolved into the staging
      for (size_t i = 0; i < step.ops.size(); ++i) {
        const Op& o = step.ops[i];
        if (!grouped(o.peer) || (o.kind != OpKind::Send && o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce))
          continue;
        const Region r{BufferId::Scratch, static_cast<int64_t>(i), static_cast<int64_t>(msg_bytes[i])};
        bytes_step.ops.push_back(o.kind == OpKind::Send ? op_send(o.peer, r) : op_recv(o.peer, r));
      }
      nccl_.enqueue_step(bytes_step, [&](const Region& r) { return stage + at[static_cast<size_t>(r.offset)]; }, 1,
                         DType::UInt8, RedOp::Sum, s);
    }
    for (size_t k = 0; k < rounds; ++k)
      for (const bool sends : {true, false})
        for (size_t i = 0; i < step.ops.size(); ++i) {
          const Op& o = step.ops[i];
          const bool msg = o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce;
          if (!msg || grouped(o.peer) || (o.kind == OpKind::Send) != sends || k >= chunks(msg_bytes[i])) continue;
          const size_t off = k * chunk, n = std::min(chunk, msg_bytes[i] - std::min(msg_bytes[i], off));
          if (sends)
            send_chunk(o.peer, stage ? stage + at[i] + off : nullptr, n, pc.seq, s);
          else
            recv_chunk(o.peer, stage ? stage + at[i] + off : nullptr, nullptr, n, false, DType::UInt8, RedOp::Sum,
                       pc.seq, s);
        }
    for (size_t i = 0; i < step.ops.size(); ++i) {  // decode (and reduce, and project) what arrived
      const Op& o = step.ops[i];
      if ((o.kind != OpKind::Recv && o.kind != OpKind::RecvReduce) || !o.dst.count) continue;
      char* d = resolve(o.dst);
      const size_t n = static_cast<size_t>(o.dst.count);
      codec_pieces(call, spec, o.dst, 0, pieces);
      char* values = o.kind == OpKind::Recv ? d : stage + at[i] + aligned(msg_bytes[i]);
      for (const CodecPiece& p : pieces)
        device_->codec_decode(gate(s), spec, dtype, stage + at[i] + p.byte, static_cast<size_t>(p.n),
                              values + static_cast<size_t>(p.elem) * esize, s);
      if (o.kind == OpKind::Recv) continue;
      if (reduces_from_src(o) && resolve(o.src) != d) data_copy(d, resolve(o.src), n * esize, s);
      data_reduce(d, values, n, dtype, call.op, s);  // dst = src (op) incoming
      project_region(spec, dtype, d, pieces, tmp, s);
    }
    for (const Op& o : step.ops) {  // local operations last, as on the host: a send projects
      // what a copy of the same step may read (all_gather copies the block it sends)
      const size_t n = static_cast<size_t>(o.dst.count);
      if (!n || (o.kind != OpKind::Copy && o.kind != OpKind::Reduce)) continue;
      char* d = resolve(o.dst);
      if (o.kind == OpKind::Copy) {
        if (d != resolve(o.src)) data_copy(d, resolve(o.src), n * esize, s);
        continue;
      }
      data_reduce(d, resolve(o.src), n, dtype, call.op, s);
      codec_pieces(call, spec, o.dst, 0, pieces);
      project_region(spec, dtype, d, pieces, tmp, s);
    }
    if (stage) device_->free_ordered(stage, s);
  }
  return Launched{};
}

}  // namespace commlib
