// Laned calls (executor.h run_lanes; docs/DESIGN.md "Laned calls"): a schedule of W > 1 lanes
// (schedule/lanes.h) run with its lanes in flight. A step starts once its lane's previous step and
// step i - window have finished (the simulator's rule, sim/run.h). Every chunk carries its lane
// (ChunkHeader::lane) and a pair's messages match first in, first out per lane (the verifier proves
// each message's two ends in one lane), so a send waits only for the pair's previous send of its
// lane, and each peer's channel, first in, first out across lanes, is taken apart here: the chunk at
// its head goes to its lane's next receive from that peer, straight into the destination when that
// receive's step runs, else parked aside (one buffer for the call's receives, kept across calls)
// until the step starts. A peer's channel is drained while a running receive from it is short of
// bytes, so no lane's early message blocks another's (and that is all liveness needs: docs/DESIGN.md "Laned calls", "No deadlock").
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "host/executor.h"
#include "host/lane_hold.h"
#include "host/laned_run.h"
#include "host/stall_clock.h"
#include "plan/describe.h"

namespace commlib {

void Executor::start_laned_step(LanedRun& run, int s, DType dtype, RedOp op) {
  run.state[s] = kRunning;
  run.active.push_back(s);
  if (!run.windowed.empty() && run.windowed[s]) {
    const uint64_t now = static_cast<uint64_t>(++run.windowed_running);
    if (now > intra_in_flight_max_.load(std::memory_order_relaxed)) intra_in_flight_max_.store(now, std::memory_order_relaxed);
  }
  ExecOp* ops = run.ops.data();
  // The step's copies and reductions are independent of its messages (ir.h): small ones first, large
  // ones once its sends are posted, run_step's rule (a peer waiting for this rank's first chunks or
  // its single-copy read does not wait for this rank's own copy: rail_ring's all_gather copies half
  // its block in each channel's first step).
  bool any_comm = false;
  size_t local_bytes = 0;
  for (size_t i = run.op_begin(s); i < run.op_end(s); ++i) {
    if (ops[i].kind == OpKind::Send || is_recv(ops[i].kind))
      any_comm = true;
    else
      local_bytes += ops[i].bytes;
  }
  const bool local_first = !any_comm || local_bytes < kInPlaceBytes;
  if (local_first) run_local_ops(ops + run.op_begin(s), ops + run.op_end(s), dtype, op);
  const size_t esize = dtype_size(dtype);
  size_t left = 0;
  for (size_t i = run.op_begin(s); i < run.op_end(s); ++i) {
    ExecOp& o = ops[i];
    run.running[i] = 1;
    if (o.kind != OpKind::Send && !is_recv(o.kind)) continue;
    if (o.kind == OpKind::Send && !local_first && (o.after < 0 || all_posted(ops[o.after])) &&
        !lane_held(static_cast<int>(o.lane))) {
      progress_send(o, esize);
      if (o.finished) bytes_sent_.fetch_add(o.bytes, std::memory_order_relaxed);
    }
    if (is_recv(o.kind)) {
      if (!run.complete[i]) ++run.waiting[o.peer];
      if (run.arrived[i]) {  // what came early lands now
        deliver_bytes(o, 0, run.parked.get() + run.parked_at[i], run.arrived[i], dtype, op);
        o.done = run.arrived[i];
      }
      o.finished = run.complete[i];
    }
    if (!o.finished) ++left;
  }
  run.left[s] = left;
  for (size_t i = run.op_begin(s); i < run.op_end(s); ++i)
    if (ops[i].kind == OpKind::Recv && !run.complete[i]) post_laned_receive(run, ops[i].peer, dtype);
  if (!local_first) run_local_ops(ops + run.op_begin(s), ops + run.op_end(s), dtype, op);
  if (!left) finish_laned_step(run, s);
}

// A link lands a posted receive's chunks by their place in the channel (the call's descriptor, the
// offset and size each chunk must have), not by lane, so a laned call posts a receive only where the
// next chunks from its peer can be nobody else's: it is the next receive of the one lane that still
// expects anything from that peer, nothing of it has come yet, and its step runs. rail_ring's
// channels give each directed pair one lane, so every one of its large plain receives over TCP lands
// in place, as in list order (without it every such chunk was copied out of the link's ring: the
// lanes' second copy, session 28).
void Executor::post_laned_receive(LanedRun& run, int p, DType dtype) {
  if (run.posted[p] >= 0 || run.lanes_from[p] != 1) return;
  Link& l = t_.link(p);
  if (!l.caps().lands_in_place) return;
  for (int k = 0; k < run.W; ++k) {
    const size_t at = static_cast<size_t>(p) * run.W + k;
    if (run.next_recv[at] >= run.recvs[at].size()) continue;
    const int i = run.recvs[at][run.next_recv[at]];
    ExecOp& o = run.ops[i];
    if (o.kind != OpKind::Recv || o.bytes < kInPlaceBytes || !run.running[i] || run.arrived[i]) return;
    l.post_recv(o.desc, o.dst, o.bytes, chunk_for(l, dtype_size(dtype)));
    o.mode = 3;
    run.posted[p] = i;
    return;
  }
}

void Executor::finish_laned_step(LanedRun& run, int s) {
  run.state[s] = kFinished;
  ++run.finished;
  if (!run.windowed.empty() && run.windowed[s]) --run.windowed_running;
  run.active.erase(std::find(run.active.begin(), run.active.end(), s));
  if (static_cast<size_t>(s) > run.first_unfinished) steps_ahead_.fetch_add(1, std::memory_order_relaxed);
  while (run.first_unfinished < run.steps_count() && run.state[run.first_unfinished] == kFinished) ++run.first_unfinished;
  for (size_t i = run.op_begin(s); i < run.op_end(s); ++i) run.running[i] = 0;
  if (run.lane_next[s] >= 0) run.ready.push_back(run.lane_next[s]);
  const int D = run.steps.window;
  if (D > 0 && static_cast<size_t>(s) + D < run.steps_count()) run.ready.push_back(s + D);
  if (!run.wake.empty() && run.wake[s] >= 0) run.ready.push_back(run.wake[s]);
}

void Executor::take_laned_chunk(LanedRun& run, int p, const ChunkHeader* h, const char* payload, DType dtype,
                                RedOp op, const CallDesc& call) {
  Link& l = t_.link(p);
  const size_t lane = h->lane;
  const size_t at = static_cast<size_t>(p) * run.W + lane;
  if (lane >= static_cast<size_t>(run.W) || run.next_recv[at] >= run.recvs[at].size()) {
    // No receive of this call takes it: another call's message, or a lane with none left from p.
    // Judged against the receive from p that comes next in the lowest lane (check_chunk names both).
    for (int k = 0; k < run.W; ++k) {
      const size_t q = static_cast<size_t>(p) * run.W + k;
      if (run.next_recv[q] >= run.recvs[q].size()) continue;
      const int i = run.recvs[q][run.next_recv[q]];
      check_chunk(run.ops[i], h, run.arrived[i], h->bytes, call, run.ops);
    }
    fail(ErrorKind::Mismatch, "rank " + std::to_string(t_.rank()) + " in " + describe_call(call) +
                                  " received from rank " + std::to_string(p) + " a message of schedule lane " +
                                  std::to_string(lane) + ", which expects none from it");
  }
  const int i = run.recvs[at][run.next_recv[at]];
  ExecOp& o = run.ops[i];
  // Landed: the link wrote the payload to o.dst already (a posted receive: post_laned_receive).
  const bool landed = (h->flags & kChunkLanded) && o.mode == 3;
  check_flags(h, l, landed, p, call);
  const bool rendezvous = h->flags & kChunkRendezvous;
  const size_t esize = dtype_size(dtype);
  const size_t got = run.arrived[i];
  const size_t expect = rendezvous ? o.bytes : std::min(chunk_for(l, esize), o.bytes - got);
  check_chunk(o, h, got, expect, call, run.ops);
  if (run.running[i]) {
    if (rendezvous)
      receive_rendezvous(o, payload, dtype, op, call);
    else if (expect && !landed)
      deliver_bytes(o, got, payload, expect, dtype, op);
    o.done += expect;
  } else if (expect) {
    char* const parked = run.parked.get() + run.parked_at[i];
    // A single-copy message is read now, so this rank acknowledges the pair's messages in the
    // order they came, which the sender's count of acknowledgements relies on.
    if (rendezvous) {
      receive_rendezvous(o, payload, dtype, op, call, parked);
      parked_reads_.fetch_add(1, std::memory_order_relaxed);
    } else {
      std::memcpy(parked + got, payload, expect);
    }
    parked_bytes_.fetch_add(expect, std::memory_order_relaxed);
  }
  l.release_recv();
  if (rendezvous) l.ack();
  run.arrived[i] += expect;
  if (run.arrived[i] < o.bytes) return;
  run.complete[i] = 1;
  if (++run.next_recv[at] == run.recvs[at].size()) --run.lanes_from[p];
  --run.expected[p];
  if (run.posted[p] == i) {
    l.unpost_recv();
    o.mode = -1;
    run.posted[p] = -1;
  }
  post_laned_receive(run, p, dtype);  // the peer's next message, if its step runs
  if (run.running[i]) {
    --run.waiting[p];
    o.finished = true;
    const int s = run.step_of[i];
    if (--run.left[s] == 0) {
      // At once, so the steps it frees run before the next chunks come off the channels: those
      // that find their step running land in place instead of being parked.
      finish_laned_step(run, s);
      start_free_steps(run, dtype, op);
    }
  }
}

void Executor::start_free_steps(LanedRun& run, DType dtype, RedOp op) {
  while (!run.ready.empty()) {  // (a step that starts with nothing to wait for finishes, freeing more)
    const int s = run.ready.back();
    run.ready.pop_back();
    if (run.can_start(s)) start_laned_step(run, s, dtype, op);
  }
}

bool Executor::progress_lanes(LanedRun& run, DType dtype, RedOp op, const CallDesc& call) {
  const size_t esize = dtype_size(dtype);
  bool moved = false;
  // Sends first, as run_step's passes (a single-copy receive reads a whole block before it returns).
  for (int s : run.active)
    for (size_t i = run.op_begin(s); i < run.op_end(s); ++i) {
      ExecOp& o = run.ops[i];
      if (o.kind != OpKind::Send || o.finished) continue;
      if (o.after >= 0 && !all_posted(run.ops[o.after])) continue;  // the pair's earlier message of this lane
      if (lane_held(static_cast<int>(o.lane))) continue;              // a test's hold (lane_hold.h)
      moved |= progress_send(o, esize);
      if (!o.finished) continue;
      bytes_sent_.fetch_add(o.bytes, std::memory_order_relaxed);
      if (--run.left[s] == 0) run.done.push_back(s);  // (finished below: `active` is being walked)
    }
  for (size_t k = 0; k < run.done.size(); ++k) finish_laned_step(run, run.done[k]);
  run.done.clear();
  start_free_steps(run, dtype, op);
  for (int p : run.from) {
    if (!run.expected[p]) continue;
    Link& l = t_.link(p);
    while (run.expected[p]) {
      const char* payload;
      const ChunkHeader* h = l.peek_recv(&payload);
      if (!h) break;
      // A chunk whose receive does not run yet stays in the channel (no copy) unless a running
      // receive from p may be behind it: then p's sends to this rank wait only while this rank
      // waits on no message from p (docs/DESIGN.md "Laned calls": why that cannot deadlock).
      const size_t at = static_cast<size_t>(p) * run.W + h->lane;
      if (!run.park_all && !run.waiting[p] && h->lane < static_cast<uint32_t>(run.W) &&
          run.next_recv[at] < run.recvs[at].size() && !run.running[run.recvs[at][run.next_recv[at]]])
        break;
      take_laned_chunk(run, p, h, payload, dtype, op, call);
      moved = true;
    }
  }
  return moved;
}

void Executor::run_lanes(std::vector<ExecOp>& ops, const LanedSteps& steps, DType dtype, RedOp op,
                         const CallDesc& call) {
  const int n = static_cast<int>(steps.lane.size());
  const int P = t_.size(), W = steps.lanes;
  LanedRun run(ops, steps);
  if (!laned_kept_) laned_kept_ = std::make_shared<LanedVectors>();
  // The kept tables in (and back out at the end, whatever happens): refilled below in place.
  std::swap(static_cast<LanedVectors&>(run), *laned_kept_);
  struct GiveBack {
    LanedRun& run;
    LanedVectors& kept;
    ~GiveBack() { std::swap(static_cast<LanedVectors&>(run), kept); }
  } give_back{run, *laned_kept_};
  run.active.clear();
  run.done.clear();
  run.ready.clear();
  run.from.clear();
  // Their bounds, so that how far they fill (which the peers' timing decides) never grows them in a
  // steady call: every step runs and finishes once, and readies at most three more (finish_laned_step)
  // besides its own first entry.
  run.active.reserve(n);
  run.done.reserve(n);
  run.ready.reserve(4 * static_cast<size_t>(n));
  run.from.reserve(P);
  run.state.assign(n, kWaiting);
  run.lane_prev.assign(n, -1);
  run.lane_next.assign(n, -1);
  run.left.assign(n, 0);
  run.wake.clear();
  run.windowed.clear();
  if (!steps.gate.empty()) {  // (each gate holds one step: the intra window slides over its steps)
    if (steps.gate.size() != static_cast<size_t>(n)) throw std::logic_error("run_lanes: an intra-window gate per step expected");
    run.wake.assign(n, -1);
    run.windowed.assign(n, 0);
    for (int s = 0; s < n; ++s)
      if (steps.gate[s] >= 0) run.wake[steps.gate[s]] = s, run.windowed[s] = run.windowed[steps.gate[s]] = 1;
  }
  run.last_lane.assign(W, -1);
  for (int s = 0; s < n; ++s) {
    int& prev = run.last_lane[steps.lane[s]];
    run.lane_prev[s] = prev;
    if (prev >= 0) run.lane_next[prev] = s;
    prev = s;
  }
  run.step_of.assign(ops.size(), 0);
  run.running.assign(ops.size(), 0);
  run.arrived.assign(ops.size(), 0);
  run.complete.assign(ops.size(), 0);
  run.parked_at.assign(ops.size(), 0);
  size_t parked_need = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (is_recv(ops[i].kind)) {
      run.parked_at[i] = parked_need;
      parked_need += ops[i].bytes;
    }
  if (parked_need > run.parked_capacity) {  // (uninitialised: only what parks is written, then read)
    run.parked.reset(new char[parked_need]);
    run.parked_capacity = parked_need;
  }
  run.recvs.resize(static_cast<size_t>(P) * W);
  for (std::vector<int>& r : run.recvs) r.clear();
  run.next_recv.assign(static_cast<size_t>(P) * W, 0);
  run.expected.assign(P, 0);
  run.waiting.assign(P, 0);
  run.lanes_from.assign(P, 0);
  run.posted.assign(P, -1);
  run.last_send.assign(static_cast<size_t>(P) * W, -1);
  std::vector<int>& last_send = run.last_send;
  for (int s = 0; s < n; ++s)
    for (size_t i = steps.begin[s]; i < steps.begin[s + 1]; ++i) {
      ExecOp& o = ops[i];
      run.step_of[i] = s;
      const size_t at = static_cast<size_t>(o.peer) * W + o.lane;
      if (o.kind == OpKind::Send) {
        o.after = last_send[at];
        last_send[at] = static_cast<int>(i);
      } else if (is_recv(o.kind)) {
        if (run.recvs[at].empty()) ++run.lanes_from[o.peer];
        run.recvs[at].push_back(static_cast<int>(i));
        if (run.expected[o.peer]++ == 0) run.from.push_back(o.peer);
      }
    }
  struct Release {  // also when a failure leaves early
    Executor& ex;
    std::vector<ExecOp>& ops;
    ~Release() {
      ex.release_buffers(ops);
      ex.idle_running_ = nullptr;
    }
  } release{*this, ops};
  idle_running_ = &run.running;
  for (int s = 0; s < n; ++s) run.ready.push_back(n - 1 - s);  // (popped from the back: list order)
  start_free_steps(run, dtype, op);

  // The wait as run_step's (stall_clock.h).
  StallClock clock;
  while (run.finished < static_cast<size_t>(n)) {
    const uint32_t seen = t_.events();
    run.park_all = park_eagerly();  // (a test seam: lane_hold.h)
    const bool moved = progress_lanes(run, dtype, op, call);
    bump(passes_);
    if (moved) {
      clock.progressed();
      continue;
    }
    if (run.finished == static_cast<size_t>(n)) break;
    bump(idle_passes_);
    const bool slow = clock.stalled();
    if (slow) {
      // A peer may have published its last chunks and then exited: drain before judging it.
      if (progress_lanes(run, dtype, op, call)) {
        clock.progressed();
        continue;
      }
      if (run.finished == static_cast<size_t>(n)) break;
    }
    on_idle(ops, call, clock.last_progress(), slow);
    sleep_on_events(seen);
  }
}

}  // namespace commlib
