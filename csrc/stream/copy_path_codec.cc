// compress= on the copy path (docs/compression.md "On device buffers (the stream engine)"): the
// host executor's compressed lowering (host/compressed_lowering.cc) step for step, with the codecs
// as device kernels (Device::codec_encode / codec_decode, kernels/codec_kernel.h) on the call's
// stream. Per step: a local copy copies; a local reduce reduces and projects its sum; a send
// encodes its region into staging and projects the sender's copy (decodes the bytes back over it),
// then its encoded bytes go through the peer's inbox in chunks as any message's do (peers over the
// nccl link: in an NCCL group, as byte messages); a receive takes the encoded bytes into staging,
// then decodes them into its region, or (recv_reduce) into staging it reduces into the region and
// projects the sum. Segments, pieces, stochastic counters and the per-call seed are the host's
// (plan/codec_pieces.h), so every value is coded as the host codes it and the results equal the
// host engine's bit for bit. Every codec operation is gated on the stop word like the path's other
// data operations. With the path's two streams (COMMLIB_DEVICE_STREAMS=2, no peer over the nccl
// link) a step's sends run on the send stream and its receives on the receive stream, as the plain
// path forks, so a piece's decoding overlaps the next piece's encoding; else the caller's stream
// runs it all. A step's local operations run after its messages, as on the host: a send's
// projection changes the region it sends, which a copy of the same step may read.
//
// Streaming: a step runs piece by piece (COMMLIB_COMPRESS_PIECE_BYTES of input, whole blocks; the
// host's pieces): piece k of every send is encoded, piece k of every message travels (its NCCL
// group, then its chunks: chunk j of every send before chunk j of every receive), piece k of every
// receive is decoded, then piece k + 1. A message's staging holds one piece, reused by the next in
// its stream's order (a send's on the send stream, a receive's on the receive stream), so staging is
// bounded by the pieces of one step, never by the call's size; it is the path's own memory, kept
// across calls and sized for the whole call before its first step (codec_staging): no allocation
// and no host wait once it fits. No deadlock: every stream runs a step's phases in the same order
// (piece k's group, then its chunks, then piece k + 1's), and a phase waits only on peers' phases of
// the same or an earlier place in that order (copy_path.h's argument, per piece).
//
// compress_inter_only across hosts: a message between ranks of one host travels raw (straight from
// and into its region, reduced out of the inbox slot as an uncompressed call's, in the first
// piece's round), only those between hosts are encoded; a sum made from a raw message, and a
// local reduce, is not projected; across hosts all_gather's ranks project their own block before
// anything travels. As the host lowering, so its results are the host's bit for bit.
#include <algorithm>

#include "common/errors.h"
#include "plan/codec_pieces.h"
#include "plan/lowering.h"
#include "stream/copy_path.h"

namespace commlib {
namespace {

size_t aligned(size_t bytes) { return (bytes + 15) / 16 * 16; }

bool is_message(const Op& o) {
  return o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce;
}

size_t chunks_of(size_t bytes, size_t chunk) { return bytes ? (bytes + chunk - 1) / chunk : 1; }

// The largest piece's encoded bytes and elements.
size_t largest_bytes(const std::vector<CodecPiece>& ps) {
  size_t b = 0;
  for (const CodecPiece& p : ps) b = std::max(b, p.bytes);
  return b;
}
size_t largest_elements(const std::vector<CodecPiece>& ps) {
  int64_t n = 0;
  for (const CodecPiece& p : ps) n = std::max(n, p.n);
  return static_cast<size_t>(n);
}

// One message of a step as this lowering runs it.
struct CodecMsg {
  size_t op = 0;
  bool coded = false;
  std::vector<CodecPiece> pieces;  // coded: the host's pieces of its region
  size_t at = 0, values = 0;       // coded: its staging (one piece), and a recv_reduce's decoded piece
};

}  // namespace

bool CopyPath::runs_encoded(const CodecSpec& spec) const {
  if (!spec.active()) return false;
  if (!spec.inter_only) return true;
  for (int p = 0; p < size_; ++p)
    if (remote(p)) return true;
  return false;
}

char* CopyPath::codec_staging(size_t bytes, DeviceStream& s) {
  if (bytes > codec_stage_bytes_) {
    // Stream-ordered, as the NCCL link's scratch: the previous call that used the old memory ran
    // before this call's stream goes on (the engine orders calls across streams), and neither call
    // waits for the device, whose other streams may be parked in waits for peers.
    const size_t want = std::max(bytes, 2 * codec_stage_bytes_);
    if (codec_stage_) device_->free_ordered(codec_stage_, s);
    codec_stage_ = nullptr;
    codec_stage_bytes_ = 0;
    codec_stage_ = device_->allocate_ordered(want, s);
    codec_stage_bytes_ = want;
  }
  return static_cast<char*>(codec_stage_);
}

void CopyPath::free_codec_staging(DeviceStream& s) {
  if (codec_stage_) device_->free_ordered(codec_stage_, s);
  codec_stage_ = nullptr;
  codec_stage_bytes_ = 0;
}

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
  const int64_t piece = codec_piece_elements(spec, esize);
  auto resolve = [&](const Region& r) { return region_address(pc.bases, r, esize, pc.desc, rank_); };
  bool hosts = false;  // the same on every rank: some rank is on another host than some other
  for (int p = 0; p < size_; ++p) hosts = hosts || remote(p);
  auto coded = [&](int peer) { return !spec.inter_only || remote(peer); };
  std::vector<CodecPiece> pieces;
  std::vector<CodecMsg> msgs;
  size_t nmsgs = 0;
  // A step's messages (msgs[0, nmsgs)) and staging: per coded message one piece's encoded bytes (a
  // recv_reduce also its decoded values), then one projection temporary as large as the largest
  // piece projected. Returns {the messages' bytes, the temporary's}.
  auto lay_out = [&](const Step& step) {
    size_t total = 0, project_bytes = 0;
    nmsgs = 0;
    for (size_t i = 0; i < step.ops.size(); ++i) {
      const Op& o = step.ops[i];
      if (o.kind == OpKind::Copy) continue;
      if (o.kind == OpKind::Reduce) {
        if (spec.inter_only) continue;  // inter_only: its operands are as they came
        codec_pieces(call, spec, o.dst, piece, pieces);
        project_bytes = std::max(project_bytes, largest_bytes(pieces));
        continue;
      }
      if (!is_message(o))
        throw CommError(std::string("compress: the schedule uses ") + op_kind_name(o.kind) +
                        ", which compress= does not lower (commlib.codecs.verify refuses such schedules)");
      if (msgs.size() <= nmsgs) msgs.resize(nmsgs + 1);
      CodecMsg& m = msgs[nmsgs++];
      m.op = i;
      m.coded = coded(o.peer);
      m.pieces.clear();
      if (!m.coded) continue;
      codec_pieces(call, spec, o.kind == OpKind::Send ? o.src : o.dst, piece, m.pieces);
      const size_t big = largest_bytes(m.pieces);
      m.at = total;
      total += aligned(big);
      if (o.kind == OpKind::RecvReduce) {
        m.values = total;
        total += aligned(largest_elements(m.pieces) * esize);
        project_bytes = std::max(project_bytes, big);
      }
    }
    return std::pair<size_t, size_t>(total, project_bytes);
  };
  // The staging of the whole call, grown (if at all) before anything of it is enqueued: a step's
  // work may run on the send and receive streams, whose earlier steps still use the staging.
  const bool prelude = spec.inter_only && hosts && call.coll == Collective::AllGather && call.count;
  const Region own{BufferId::Input, 0, call.count};
  size_t need = 0;
  if (prelude) {
    codec_pieces(call, spec, own, piece, pieces);
    need = largest_bytes(pieces);
  }
  for (const Step& step : pc.plan.sched.steps) {
    const auto [total, project_bytes] = lay_out(step);
    need = std::max(need, total + project_bytes);
  }
  char* stage = need ? codec_staging(need, s) : nullptr;
  if (prelude) {
    // A flat all_gather sends a block raw within its host and encoded across: each rank projects
    // its own block first, so every rank holds Q(block) (host/compressed_lowering.cc).
    codec_pieces(call, spec, own, piece, pieces);
    project_region(spec, dtype, resolve(own), pieces, stage, s);
  }
  // Sends (their encoding, projection and chunks) on the path's send stream, receives (chunks,
  // decoding, reduction, projection) and the local operations on its receive stream, as the plain
  // path forks (enqueue): a piece's decoding overlaps the next piece's encoding and copies. Each
  // stream keeps the piece order, so the no-deadlock argument holds per stream. Peers over the nccl
  // link take a step's sends and receives in one group: such calls stay on the caller's stream.
  const bool fork = streams_ == 2 && !nccl_.carries_any() && !pc.plan.sched.steps.empty();
  DeviceStream& S = fork ? *send_stream_ : s;
  DeviceStream& R = fork ? *recv_stream_ : s;
  if (fork) {
    device_->record(*fork_, s);
    device_->wait_event(S, *fork_);
    device_->wait_event(R, *fork_);
  }
  const size_t raw_chunk = std::max<size_t>(slot_bytes_ / esize * esize, esize);
  for (size_t t = 0; t < pc.plan.sched.steps.size(); ++t) {
    const Step& step = pc.plan.sched.steps[t];
    const size_t total = lay_out(step).first;
    char* tmp = stage ? stage + total : nullptr;
    if (fork && t) {  // a step sends what the previous one received, and receives into what it sent
      device_->wait_event(S, *received_step_);
      device_->wait_event(R, *sent_step_);
    }
    size_t rounds = 0;  // pieces of the longest message (a raw one travels in the first)
    for (size_t j = 0; j < nmsgs; ++j) rounds = std::max(rounds, msgs[j].coded ? msgs[j].pieces.size() : 1);
    for (size_t k = 0; k < rounds; ++k) {
      for (size_t j = 0; j < nmsgs; ++j) {  // encode and project piece k of every coded send
        const CodecMsg& m = msgs[j];
        const Op& o = step.ops[m.op];
        if (!m.coded || o.kind != OpKind::Send || k >= m.pieces.size() || !m.pieces[k].n) continue;
        const CodecPiece& p = m.pieces[k];
        char* v = resolve(o.src) + static_cast<size_t>(p.elem) * esize;
        device_->codec_encode(gate(S), spec, dtype, v, static_cast<size_t>(p.n), stage + m.at, p.counter, S);
        device_->codec_decode(gate(S), spec, dtype, stage + m.at, static_cast<size_t>(p.n), v, S);
      }
      if (nccl_.carries_any()) {  // peers over the nccl link: raw messages, then piece k's bytes, as groups
        Step group;
        if (k == 0) {
          for (size_t j = 0; j < nmsgs; ++j)
            if (!msgs[j].coded && grouped(step.ops[msgs[j].op].peer)) group.ops.push_back(step.ops[msgs[j].op]);
          if (!group.ops.empty()) nccl_.enqueue_step(group, resolve, esize, dtype, call.op, s);
          group.ops.clear();
        }
        for (size_t j = 0; j < nmsgs; ++j) {  // each piece as a byte region naming its message
          const CodecMsg& m = msgs[j];
          const Op& o = step.ops[m.op];
          if (!m.coded || !grouped(o.peer) || k >= m.pieces.size()) continue;
          const Region r{BufferId::Scratch, static_cast<int64_t>(j), static_cast<int64_t>(m.pieces[k].bytes)};
          group.ops.push_back(o.kind == OpKind::Send ? op_send(o.peer, r) : op_recv(o.peer, r));
        }
        if (!group.ops.empty())
          nccl_.enqueue_step(group, [&](const Region& r) { return stage + msgs[static_cast<size_t>(r.offset)].at; }, 1,
                             DType::UInt8, RedOp::Sum, s);
      }
      // Piece k through the inboxes: chunk c of every send, then of every receive (copy_path.h).
      auto units = [&](const CodecMsg& m) -> size_t {
        const Op& o = step.ops[m.op];
        if (grouped(o.peer)) return 0;
        if (m.coded) return k < m.pieces.size() ? chunks_of(m.pieces[k].bytes, slot_bytes_) : 0;
        const size_t raw = static_cast<size_t>((o.kind == OpKind::Send ? o.src : o.dst).count) * esize;
        return k == 0 ? chunks_of(raw, raw_chunk) : 0;
      };
      size_t units_k = 0;
      for (size_t j = 0; j < nmsgs; ++j) units_k = std::max(units_k, units(msgs[j]));
      for (size_t c = 0; c < units_k; ++c)
        for (const bool sends : {true, false})
          for (size_t j = 0; j < nmsgs; ++j) {
            const CodecMsg& m = msgs[j];
            const Op& o = step.ops[m.op];
            if ((o.kind == OpKind::Send) != sends || c >= units(m)) continue;
            const size_t chunk = m.coded ? static_cast<size_t>(slot_bytes_) : raw_chunk;
            const size_t bytes = m.coded ? m.pieces[k].bytes
                                         : static_cast<size_t>((sends ? o.src : o.dst).count) * esize;
            const size_t off = c * chunk, n = std::min(chunk, bytes - std::min(bytes, off));
            if (m.coded) {
              char* at = stage ? stage + m.at + off : nullptr;
              if (sends)
                send_chunk(o.peer, at, n, pc.seq, S);
              else
                recv_chunk(o.peer, at, nullptr, n, false, DType::UInt8, RedOp::Sum, pc.seq, R);
            } else if (sends) {
              const char* src = resolve(o.src);
              send_chunk(o.peer, src ? src + off : nullptr, n, pc.seq, S);
            } else {  // raw: straight into the region, reduced out of the slot as an uncompressed call's
              char* d = resolve(o.dst);
              const char* src = reduces_from_src(o) ? resolve(o.src) : nullptr;
              recv_chunk(o.peer, d ? d + off : nullptr, src ? src + off : nullptr, n, o.kind == OpKind::RecvReduce,
                         dtype, call.op, pc.seq, R);
            }
          }
      for (size_t j = 0; j < nmsgs; ++j) {  // decode (and reduce, and project) piece k of what arrived
        const CodecMsg& m = msgs[j];
        const Op& o = step.ops[m.op];
        if (!m.coded || o.kind == OpKind::Send || k >= m.pieces.size() || !m.pieces[k].n) continue;
        const CodecPiece& p = m.pieces[k];
        const size_t n = static_cast<size_t>(p.n), off = static_cast<size_t>(p.elem) * esize;
        char* d = resolve(o.dst) + off;
        if (o.kind == OpKind::Recv) {
          device_->codec_decode(gate(R), spec, dtype, stage + m.at, n, d, R);
          continue;
        }
        char* values = stage + m.values;
        device_->codec_decode(gate(R), spec, dtype, stage + m.at, n, values, R);
        if (reduces_from_src(o) && resolve(o.src) + off != d) data_copy(d, resolve(o.src) + off, n * esize, R);
        data_reduce(d, values, n, dtype, call.op, R);  // dst = src (op) incoming
        device_->codec_encode(gate(R), spec, dtype, d, n, tmp, p.counter, R);  // the sum's projection
        device_->codec_decode(gate(R), spec, dtype, tmp, n, d, R);
      }
    }
    if (fork) {  // the local operations follow the step's sends (their projections)
      device_->record(*sent_step_, S);
      device_->wait_event(R, *sent_step_);
    }
    for (const Op& o : step.ops) {  // local operations last, as on the host: a send projects
      // what a copy of the same step may read (all_gather copies the block it sends)
      const size_t n = static_cast<size_t>(o.dst.count);
      if (!n || (o.kind != OpKind::Copy && o.kind != OpKind::Reduce)) continue;
      char* d = resolve(o.dst);
      if (o.kind == OpKind::Copy) {
        if (d != resolve(o.src)) data_copy(d, resolve(o.src), n * esize, R);
        continue;
      }
      data_reduce(d, resolve(o.src), n, dtype, call.op, R);
      if (spec.inter_only) continue;  // inter_only: its operands are as they came (the host's rule)
      codec_pieces(call, spec, o.dst, piece, pieces);
      project_region(spec, dtype, d, pieces, tmp, R);
    }
    if (fork) device_->record(*received_step_, R);
  }
  if (fork) {
    device_->wait_event(s, *sent_step_);
    device_->wait_event(s, *received_step_);
  }
  return Launched{};
}

}  // namespace commlib
