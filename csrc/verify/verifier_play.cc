// The replay's play (verifier_replay.h): ranks enter steps, sends meet receives (rendezvous),
// symbolic values move and combine; a rank that can never finish its step is a deadlock.
#include "verify/verifier_replay.h"

namespace commlib {
namespace verify {

void Replay::enter_step(int r) {
  Rank& R = ranks_[r];
  for (;;) {
    if (R.step >= sch_[r].steps.size()) {
      R.done = true;
      return;
    }
    const auto& ops = sch_[r].steps[R.step].ops;
    R.matched.assign(ops.size(), 0);
    R.pending = 0;
    R.know_at_entry = R.know;
    for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
      const Op& o = ops[oi];
      if (o.kind == OpKind::Send) {
        R.send_to[o.peer] = oi;
        ++R.pending;
      } else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) {
        R.recv_from[o.peer] = oi;
        ++R.pending;
      }
    }
    for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
      const Op& o = ops[oi];
      if (R.matched[oi]) continue;
      if (o.kind == OpKind::Send) try_match(r, oi, o.peer);
      else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) try_match_recv(r, oi, o.peer);
    }
    if (R.pending > 0) return;
    finish_step(r);
  }
}

// Sender s (op si) with receiver q's current step.
void Replay::try_match(int s, int si, int q) {
  Rank& Q = ranks_[q];
  if (Q.done) return;
  const int qi = Q.recv_from[s];
  if (qi < 0 || Q.matched[qi]) return;
  transfer(s, si, q, qi);
}

void Replay::try_match_recv(int q, int qi, int s) {
  Rank& S = ranks_[s];
  if (S.done) return;
  const int si = S.send_to[q];
  if (si < 0 || S.matched[si]) return;
  transfer(s, si, q, qi);
}

void Replay::transfer(int s, int si, int q, int qi) {
  Rank& S = ranks_[s];
  Rank& Q = ranks_[q];
  const Op& so = sch_[s].steps[S.step].ops[si];
  const Op& ro = sch_[q].steps[Q.step].ops[qi];
  if (so.src.count != ro.dst.count)
    fail(where(s, S.step, si) + " sends " + std::to_string(so.src.count) + " elements but " +
         where(q, Q.step, qi) + " receives " + std::to_string(ro.dst.count));
  const int64_t n = so.src.count;
  S.mem.read(abs(s, so.src), n, pa_);
  if (ro.kind == OpKind::Recv) {
    Q.mem.write(abs(q, ro.dst), n, pa_);
  } else {
    Q.mem.read(abs(q, reduces_from_src(ro) ? ro.src : ro.dst), n, pb_);
    verify::combine_pieces(sets_, pb_, pa_, pc_);
    Q.mem.write(abs(q, ro.dst), n, pc_);
  }
  // Who-heard-from-whom matters only for barriers; tracking it elsewhere would intern ~P^2 sets.
  if (c_ == Collective::Barrier) Q.know = sets_.unite(Q.know, S.know_at_entry);
  S.matched[si] = 1;
  Q.matched[qi] = 1;
  if (--S.pending == 0) ready_.push_back(s);
  if (--Q.pending == 0) ready_.push_back(q);
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
      R.mem.write(abs(r, o.dst), o.dst.count, pc_);
    }
  }
  for (const Op& o : ops) {
    if (o.kind == OpKind::Send) R.send_to[o.peer] = -1;
    else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) R.recv_from[o.peer] = -1;
  }
  ++R.step;
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
  for (int r = 0; r < P_; ++r) enter_step(r);
  while (!ready_.empty()) {
    const int r = ready_.back();
    ready_.pop_back();
    Rank& R = ranks_[r];
    if (R.done || R.pending != 0) continue;
    finish_step(r);
    enter_step(r);
  }
  for (int r = 0; r < P_; ++r) {
    const Rank& R = ranks_[r];
    if (R.done) continue;
    const auto& ops = sch_[r].steps[R.step].ops;
    std::string msg = "deadlock: rank " + std::to_string(r) + " stuck in step " + std::to_string(R.step) +
                      " waiting for";
    for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {
      const Op& o = ops[oi];
      if (R.matched[oi] || !(o.kind == OpKind::Send || o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce))
        continue;
      const Rank& Q = ranks_[o.peer];
      msg += std::string(" ") + (o.kind == OpKind::Send ? "send to" : "receive from") + " rank " +
             std::to_string(o.peer) + " (" +
             (Q.done ? std::string("which has finished")
                     : "which is in step " + std::to_string(Q.step)) +
             ")";
      break;
    }
    fail(msg);
  }
}

}  // namespace verify
}  // namespace commlib
