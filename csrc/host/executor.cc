#include "host/executor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "host/stall_clock.h"
#include "plan/describe.h"
#include "plan/lowering.h"
#include "kernels/cpu_copy.h"
#include "kernels/cpu_reduce.h"

namespace commlib {

namespace {

using Clock = std::chrono::steady_clock;

bool is_comm(OpKind k) { return k == OpKind::Send || k == OpKind::Recv || k == OpKind::RecvReduce; }

// Whether every chunk of send `o` is on its link (a rendezvous send's one header; an in-place
// send's last chunk), so a later message to the same peer may follow it.
bool all_posted(const ExecOp& o) { return o.finished || o.rendezvous != 0; }

}  // namespace

void Executor::fail(ErrorKind kind, const std::string& message) {
  t_.publish_failure(kind, message);
  throw_kind(kind, message);
}

// Payload bytes per chunk on link `l`: whole elements, and the same at both ends of the link (its
// chunk size and the call's cap are).
size_t Executor::chunk_for(const Link& l, size_t esize) const {
  const size_t chunk = chunk_cap_ ? std::min(chunk_cap_, l.caps().chunk_bytes) : l.caps().chunk_bytes;
  return std::max(chunk / esize * esize, esize);
}

bool Executor::progress_send(ExecOp& o, size_t esize) {
  Link& l = t_.link(o.peer);
  const size_t cap = chunk_for(l, esize);
  if (o.mode < 0) {  // decided once per message: the receiver takes either form
    o.mode = (o.bytes >= single_copy_min_ && o.ready >= o.bytes && l.peer_reads_directly()) ? 1
             : (o.bytes >= kInPlaceBytes && l.caps().sends_in_place) ? 2
                                                                : 0;
    if (o.mode == 1) single_copy_sends_.fetch_add(1, std::memory_order_relaxed);
  }
  if (o.mode == 2) return progress_send_in_place(o, l, cap);
  bool moved = false;
  if (o.mode == 1) {
    if (!o.rendezvous) {
      char* payload;
      ChunkHeader* h = l.acquire_send(&payload);
      if (!h) return false;
      h->desc = o.desc;
      h->offset = 0;
      h->bytes = o.bytes;
      h->flags = kChunkRendezvous;
      h->lane = o.lane;
      const uint64_t address = reinterpret_cast<uint64_t>(o.src);
      std::memcpy(payload, &address, sizeof(address));
      l.publish_send();
      o.rendezvous = ++rendezvous_sent_[o.peer];
      moved = true;
    }
    // The buffer must stay untouched until the peer has read it.
    if (l.acked() >= o.rendezvous) {
      o.done = o.bytes;
      o.finished = true;
      moved = true;
    }
    return moved;
  }
  while (!o.finished) {
    size_t n = std::min(cap, o.bytes - o.done);
    if (o.ready < o.done + n) break;  // the rest of this chunk is not written yet
    char* payload;
    ChunkHeader* h = l.acquire_send(&payload);
    if (!h) break;
    h->desc = o.desc;
    h->offset = o.done;
    h->bytes = n;
    h->flags = 0;
    h->lane = o.lane;
    fill_chunk(o, payload, n);
    l.publish_send();
    o.done += n;
    o.finished = o.done == o.bytes;
    moved = true;
  }
  return moved;
}

// Zero-copy: the link writes each chunk's payload from o.src itself; the send is complete (and
// o.src may change) only once the link has written the last chunk.
bool Executor::progress_send_in_place(ExecOp& o, Link& l, size_t cap) {
  bool moved = false;
  while (!o.rendezvous) {
    const size_t n = std::min(cap, o.bytes - o.done);
    if (o.ready < o.done + n) break;  // the rest of this chunk is not written yet
    char* payload;
    ChunkHeader* h = l.acquire_send(&payload);
    if (!h) break;
    h->desc = o.desc;
    h->offset = o.done;
    h->bytes = n;
    h->flags = 0;
    h->lane = o.lane;
    const uint64_t ticket = l.publish_send_in_place(o.src + o.done);
    o.done += n;
    if (o.done == o.bytes) o.rendezvous = ticket;
    moved = true;
  }
  if (o.rendezvous && l.sends_completed() >= o.rendezvous) {
    o.finished = true;
    moved = true;
  }
  return moved;
}

// Tells each link where the first message it delivers in this step goes (plain receives only: a
// reduction needs the data beside the destination, not in it).
void Executor::post_receives(std::vector<ExecOp>& ops, DType dtype) {
  const size_t esize = dtype_size(dtype);
  for (ExecOp& o : ops) {
    if (o.kind != OpKind::Recv || o.bytes < kInPlaceBytes) continue;
    Link& l = t_.link(o.peer);
    if (!l.caps().lands_in_place) continue;
    if (o.after >= 0) continue;  // a later message from the same peer arrives behind this one: not posted
    l.post_recv(o.desc, o.dst, o.bytes, chunk_for(l, esize));
    o.mode = 3;
  }
}

// A pair's messages in a step move in op order (ir.h): each op learns the one before it, if any.
void Executor::order_messages(std::vector<ExecOp>& ops) {
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    ExecOp& o = ops[i];
    if (!is_comm(o.kind)) continue;
    int& last = (o.kind == OpKind::Send ? last_send_ : last_recv_)[o.peer];
    o.after = last;
    last = i;
  }
  for (const ExecOp& o : ops)
    if (is_comm(o.kind)) (o.kind == OpKind::Send ? last_send_ : last_recv_)[o.peer] = -1;
}

void Executor::release_buffers(std::vector<ExecOp>& ops) {
  for (ExecOp& o : ops) {
    if (o.kind == OpKind::Send && o.mode == 2 && !o.finished) t_.link(o.peer).detach_sends();
    if (o.kind == OpKind::Recv && o.mode == 3) {
      t_.link(o.peer).unpost_recv();
      o.mode = -1;
    }
  }
}

bool Executor::progress(std::vector<ExecOp>& ops, DType dtype, RedOp op, const CallDesc& call, size_t* pending) {
  const size_t esize = dtype_size(dtype);
  bool moved = false;
  size_t left = 0;
  // Two passes: every send first, then the receives. A single-copy receive reads its whole block
  // before the loop moves on, so a send after it in the step would publish this rank's buffer only
  // once that read is done, and that peer would wait for it: hierarchical all_gather's forwarding
  // step on one host ([send q, recv q] per local peer) published its block to its second and third
  // readers only after reading the first and second peers' blocks (bench/RESULTS_collectives.md,
  // session 25; direct's schedules list their sends first for the same reason). A step's ops are
  // independent (schedule/ir.h), and messages to or from one peer keep their order (ExecOp::after).
  for (int sends = 1; sends >= 0; --sends)
  for (ExecOp& o : ops) {
    if ((o.kind == OpKind::Send) != (sends == 1)) continue;
    if (o.kind == OpKind::Send) {
      if (o.finished) continue;  // (a finished send that reported progress again would spin forever)
      if (o.after >= 0 && !all_posted(ops[o.after])) {  // its chunks would come between the earlier one's
        ++left;
        continue;
      }
      moved |= progress_send(o, esize);
      if (o.finished)
        bytes_sent_.fetch_add(o.bytes, std::memory_order_relaxed);
      else
        ++left;
    } else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) {
      if (!o.finished && o.after >= 0 && !ops[o.after].finished) {  // the link's next chunks are the earlier one's
        ++left;
        continue;
      }
      Link& l = t_.link(o.peer);
      const size_t cap = chunk_for(l, esize);
      while (!o.finished) {
        const char* payload;
        const ChunkHeader* h = l.peek_recv(&payload);
        if (!h) break;
        const bool rendezvous = h->flags & kChunkRendezvous;
        // Landed: the link already wrote the payload to o.dst (it sets this flag itself, after
        // checking the chunk against what this op posted; it never comes from a peer).
        const bool landed = (h->flags & kChunkLanded) && o.mode == 3;
        check_flags(h, l, landed, o.peer, call);
        size_t expect = rendezvous ? o.bytes : std::min(cap, o.bytes - o.done);
        check_chunk(o, h, o.done, expect, call, ops);
        if (rendezvous)
          receive_rendezvous(o, payload, dtype, op, call);
        else if (expect && !landed)
          deliver_bytes(o, o.done, payload, expect, dtype, op);
        l.release_recv();
        if (rendezvous) l.ack();
        o.done += expect;
        o.finished = o.done == o.bytes;
        moved = true;
      }
      if (!o.finished) ++left;
    }
  }
  *pending = left;
  return moved;
}

void Executor::on_idle(std::vector<ExecOp>& ops, const CallDesc& call, Clock::time_point last_progress,
                       bool slow_checks) {
  const int me = t_.rank();
  auto what = [&] { return describe_call(call); };
  // A failed peer aborts the whole communicator: re-raise its error here, and pass it on.
  for (int p = 0; p < t_.size(); ++p) {
    if (p == me) continue;
    PeerStatus st = t_.peer_status(p, false);
    if (st.state == PeerState::Failed)
      fail(st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind,
           "rank " + std::to_string(me) + " in " + what() + ": rank " + std::to_string(p) + " failed: " + st.message);
  }
  if (!slow_checks) return;
  // (every batch's receives: a p2p batch's `call` is its last message or, for an all_to_all with
  // split sizes, the collective it is; a collective's ops are no messages of point-to-point)
  check_device_messages(ops);
  auto waiting = [&](size_t i) {  // a message this rank waits for (run_lanes: of a running step)
    const ExecOp& o = ops[i];
    return is_comm(o.kind) && !o.finished && (!idle_running_ || (*idle_running_)[i]);
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!waiting(i)) continue;
    const ExecOp& o = ops[i];
    const int p = o.peer;
    PeerStatus st = t_.peer_status(p, true);
    const char* doing = o.kind == OpKind::Send ? "send to" : "receive from";
    if (st.state == PeerState::Dead)
      fail(ErrorKind::Peer, t_.describe_peer(p) + " died during " + what() + "; rank " + std::to_string(me) +
                                " was waiting to " + doing + " it" + (st.message.empty() ? "" : " (" + st.message + ")"));
    if (st.state == PeerState::Closed)
      fail(ErrorKind::Peer, "rank " + std::to_string(p) + " closed the communicator during " + what() + "; rank " +
                                std::to_string(me) + " was waiting to " + doing + " it");
    CallDesc pc;
    if (call.coll != static_cast<uint8_t>(Collective::Send) && t_.peer_call(p, &pc) && pc.seq == call.seq &&
        pc != call)
      fail(ErrorKind::Mismatch, mismatch_message(me, call, p, pc));
  }
  double idle_s = std::chrono::duration<double>(Clock::now() - last_progress).count();
  if (idle_s > timeout_s()) {
    // A peer that is in this very call (its published call is this one) is waiting on somebody
    // itself, or working: its own timeout names the rank that did not come, and its failure reaches
    // this rank through the first loop above. Blamed only after a second timeout, so the error
    // names the silent rank rather than whichever waiting rank's clock ran out first (rank 2 of 3
    // in recursive doubling waits on rank 0 from its first step, before rank 0 waits on a silent
    // rank 1: tests/host/test_errors.py test_silent_peer_times_out, failed so on CI once).
    const bool collective = call.coll != static_cast<uint8_t>(Collective::Send);
    auto in_this_call = [&](int p) {
      CallDesc pc;
      return collective && t_.peer_call(p, &pc) && pc.seq == call.seq;
    };
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!waiting(i)) continue;
      const ExecOp& o = ops[i];
      if (idle_s <= 2 * timeout_s() && in_this_call(o.peer)) continue;
      const char* doing = o.kind == OpKind::Send ? "send to" : "receive from";
      // " timeout " and no variable name: the timeout comes from init(timeout=), a torch group's
      // timeout= or COMMLIB_TIMEOUT, and torch users' code matches torch's wording.
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", timeout_s());
      fail(ErrorKind::Peer, "rank " + std::to_string(o.peer) + " did not answer within " + timeout_owner() + " (" +
                                secs + " s) during " + what() + "; rank " + std::to_string(me) + " was waiting to " + doing + " it (" +
                                std::to_string(o.bytes - o.done) + " bytes left)");
    }
  }
}

void Executor::run_local_ops(ExecOp* begin, ExecOp* end, DType dtype, RedOp op) {
  const size_t esize = dtype_size(dtype);
  for (ExecOp* it = begin; it != end; ++it) {
    ExecOp& o = *it;
    if (o.kind == OpKind::Copy) {
      if (o.bytes && o.dst != o.src) {
        const bool overlap = o.dst < o.src + o.bytes && o.src < o.dst + o.bytes;
        if (overlap)
          std::memmove(o.dst, o.src, o.bytes);
        else
          copy_bytes(o.dst, o.src, o.bytes, streams(o.bytes));
      }
    } else if (o.kind == OpKind::Reduce) {
      if (o.bytes) reduce_inplace(o.dst, o.src, o.bytes / esize, dtype, op);
    }
  }
}

void Executor::run_step(std::vector<ExecOp>& ops, DType dtype, RedOp op, const CallDesc& call, StepWork* work) {
  bool any_comm = false;
  size_t local_bytes = 0;
  for (const ExecOp& o : ops) {
    if (is_comm(o.kind))
      any_comm = true;
    else if (o.kind == OpKind::Copy || o.kind == OpKind::Reduce)
      local_bytes += o.bytes;
  }
  // A step's ops are independent (ir.h), so its local copies and reductions may run in any order
  // with its messages. Small ones run first, as before (nothing to gain, and the latency path stays
  // one loop). Large ones run after the messages are posted: a peer waiting for this rank's data
  // (a single-copy read of its buffer, the first channel chunks) starts while this rank copies, not
  // after (all_to_all direct, 8 MiB on 4 ranks: each rank's own 2 MiB block copied before it posted
  // anything held all three readers of its buffer for that copy).
  const bool local_first = !any_comm || local_bytes < kInPlaceBytes;
  if (local_first) run_local_ops(ops.data(), ops.data() + ops.size(), dtype, op);
  if (!any_comm) return;
  order_messages(ops);
  post_receives(ops, dtype);
  struct Release {  // also when a failure leaves this step early
    Executor& ex;
    std::vector<ExecOp>& ops;
    ~Release() { ex.release_buffers(ops); }
  } release{*this, ops};
  if (!local_first) {
    size_t pending = 0;
    progress(ops, dtype, op, call, &pending);  // sends posted (and whatever has already arrived taken)
    run_local_ops(ops.data(), ops.data() + ops.size(), dtype, op);
  }

  StallClock clock;
  size_t pending = 0;
  for (;;) {
    uint32_t seen = t_.events();
    bool moved = progress(ops, dtype, op, call, &pending);
    bump(passes_);
    const bool worked = work && work->run();
    if (pending == 0 && !worked) break;
    if (moved || worked) {
      clock.progressed();
      continue;
    }
    bump(idle_passes_);
    const bool slow = clock.stalled();
    if (slow) {
      // A peer may have published its last chunks and then exited: drain before judging it.
      if (progress(ops, dtype, op, call, &pending)) {
        clock.progressed();
        continue;
      }
      if (pending == 0) break;
    }
    on_idle(ops, call, clock.last_progress(), slow);
    sleep_on_events(seen);
  }
}

void Executor::sleep_on_events(uint32_t seen) {
  bump(waits_);
  if (!t_.wait_events(seen, kSleepSliceUs, spin_)) spin_ = false;
}

void Executor::check_device_messages(const std::vector<ExecOp>& ops) {
  // Point-to-point messages of a pair share one numbering on host and device buffers: a receive
  // whose message the peer sent on a device buffer is a mismatch (the stream engine's probe).
  for (const ExecOp& o : ops) {
    if (o.kind != OpKind::Recv || o.finished || o.desc.coll != static_cast<uint8_t>(Collective::Send)) continue;
    probes_.for_each([&](P2PProbe& probe) {
      CallDesc sent;
      if (probe(o.peer, o.desc, &sent))
        fail(ErrorKind::Mismatch, "rank " + std::to_string(t_.rank()) + " receives " + describe_call(o.desc) +
                                      " from rank " + std::to_string(o.peer) + " but rank " + std::to_string(o.peer) +
                                      " sent " + describe_call(sent));
    });
  }
}

}  // namespace commlib
