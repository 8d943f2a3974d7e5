// The replay's play (verifier_replay.h): the schedule player (schedule/player.h) enters steps and
// meets sends with receives (rendezvous); here symbolic values move and combine; a rank that can
// never finish its step is a deadlock.
#include "verify/verifier_replay.h"

#include <algorithm>

namespace commlib {
namespace verify {

// Enters rank r's steps until one waits for a peer or the rank has none left.
void Replay::enter_step(int r) {
  for (;;) {
    if (ranks_[r].step >= sch_[r].steps.size()) {
      player_.finish(r);
      return;
    }
    if (!player_.enter(r)) return;
    finish_step(r);
  }
}

void Replay::on_enter(int r) {
  Rank& R = ranks_[r];
  R.know_at_entry = R.know;
  const auto& ops = sch_[r].steps[R.step].ops;
  R.next_same.assign(ops.size(), -1);
  // Each (direction, peer) chain in op order: walked backwards, so every op points at the next one.
  for (int oi = static_cast<int>(ops.size()) - 1; oi >= 0; --oi) {
    const Op& o = ops[oi];
    if (!is_message(o.kind)) continue;
    int& head = o.kind == OpKind::Send ? R.send_to[o.peer] : R.recv_from[o.peer];
    R.next_same[oi] = head;
    head = oi;
  }
}

void Replay::on_transfer(int s, int si, int q, int qi) {
  Rank& S = ranks_[s];
  Rank& Q = ranks_[q];
  const Op& so = sch_[s].steps[S.step].ops[si];
  const Op& ro = sch_[q].steps[Q.step].ops[qi];
  if (so.src.count != ro.dst.count)
    fail(where(s, S.step, si) + " sends " + std::to_string(so.src.count) + " elements but " +
         where(q, Q.step, qi) + " receives " + std::to_string(ro.dst.count));
  const int64_t n = so.src.count;
  S.mem.read(abs(s, so.src), n, pa_);
  const bool code = coded(s, q);
  if (code) {
    project(pa_);
    if (codec_ == kCodecProjecting) S.mem.write(abs(s, so.src), n, pa_);
  }
  if (ro.kind == OpKind::Recv) {
    Q.mem.write(abs(q, ro.dst), n, pa_);
  } else {
    Q.mem.read(abs(q, reduces_from_src(ro) ? ro.src : ro.dst), n, pb_);
    verify::combine_pieces(sets_, pb_, pa_, pc_);
    if (code && codec_ == kCodecProjecting) project(pc_);
    Q.mem.write(abs(q, ro.dst), n, pc_);
  }
  // Who-heard-from-whom matters only for barriers; tracking it elsewhere would intern ~P^2 sets.
  if (c_ == Collective::Barrier) Q.know = sets_.unite(Q.know, S.know_at_entry);
}

void Replay::finish_step(int r) {
  Rank& R = ranks_[r];
  const auto& ops = sch_[r].steps[R.step].ops;
  for (const Op& o : ops) {
    if (o.kind == OpKind::Copy) {
      if (noop_copy(r, o)) continue;
      R.mem.read(abs(r, o.src), o.src.count, pa_);
      R.mem.write(abs(r, o.dst), o.dst.count, pa_);
    } else if (o.kind == OpKind::Reduce) {
      R.mem.read(abs(r, o.src), o.src.count, pa_);
      R.mem.read(abs(r, o.dst), o.dst.count, pb_);
      verify::combine_pieces(sets_, pb_, pa_, pc_);
      if (codec_ == kCodecProjecting && codec_hosts_.empty()) project(pc_);
      R.mem.write(abs(r, o.dst), o.dst.count, pc_);
    }
  }
  for (const Op& o : ops) {
    if (o.kind == OpKind::Send) R.send_to[o.peer] = -1;
    else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) R.recv_from[o.peer] = -1;
  }
  ++R.step;
  if (trace_) record(r);
  player_.leave(r);
}

void Replay::simulate() {
  // Copy count checks up front (cheap, clearer message than a later mismatch).
  for (int r = 0; r < P_; ++r)
    for (size_t st = 0; st < sch_[r].steps.size(); ++st)
      for (int oi = 0; oi < static_cast<int>(sch_[r].steps[st].ops.size()); ++oi) {
        const Op& o = sch_[r].steps[st].ops[oi];
        if ((o.kind == OpKind::Copy || o.kind == OpKind::Reduce) && o.src.count != o.dst.count)
          fail(where(r, st, oi) + ": source and destination counts differ");
      }
  if (one_sided_) return play_one_sided();
  if (codec_ && c_ == Collective::AllGather && !codec_hosts_.empty() &&
      std::any_of(codec_hosts_.begin(), codec_hosts_.end(), [&](int h) { return h != codec_hosts_[0]; }))
    project_inputs();
  player_.reset(P_);
  for (int r = 0; r < P_; ++r) enter_step(r);
  while (!ready_.empty()) {
    const int r = ready_.back();
    ready_.pop_back();
    if (player_.done(r) || player_.pending(r) != 0) continue;
    finish_step(r);
    enter_step(r);
  }
  const std::string stuck = player_.deadlock();
  if (!stuck.empty()) fail(stuck);
}

}  // namespace verify
}  // namespace commlib
