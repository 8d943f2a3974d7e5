// One rendezvous player for schedules, shared by the verifier's replay (verify/verifier_play.cc)
// and the simulator's run (sim/simulator.cc): ranks enter their steps; each send meets the receive
// its peer posted for it in the peer's current step, the messages of a pair first in, first out
// (ir.h: several with one peer in one step match in op order, so find_op returns the first one not
// yet matched, and enter() tries a step's ops in op order); a step whose
// messages are all matched is complete; a rank that never completes its step is a deadlock.
//
// What the player leaves to its game (a class with the members below, which may be private if it
// befriends SchedulePlayer<Game>): what a step's operations are, what a matched message does
// (symbolic values moved and combined, or a transfer timed on modelled links), and when a rank
// whose step is complete enters its next one (at once, or at a later simulated time).
//
//   int op_count(int r) const;              // operations of rank r's current step
//   PlayKind op_kind(int r, int i) const;   // Send, Recv (plain or reducing) or Local
//   int op_peer(int r, int i) const;
//   // q's first operation (op order) of `kind` with `peer` in its current step not yet matched, or -1.
//   int find_op(int q, PlayKind kind, int peer, const std::vector<uint8_t>& matched) const;
//   void on_enter(int r);                   // r enters its current step, before any matching
//   void on_transfer(int s, int si, int q, int qi);  // s's send si meets q's receive qi
//   void on_complete(int r);                // r's step completed while another rank entered
//   int64_t step_of(int r) const;           // r's current step, for the deadlock report
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace commlib {
namespace sched {

enum class PlayKind : uint8_t { Local, Send, Recv };

template <class Game>
class SchedulePlayer {
 public:
  explicit SchedulePlayer(Game& game) : game_(game) {}

  void reset(int ranks) { ranks_.assign(ranks, Rank{}); }

  // Rank r enters its current step: each of its sends and receives meets its match in the steps
  // the peers are in now (a peer entering later finds it instead). True if the step is complete
  // at once (every message matched, or none): the caller finishes it then; a step completed
  // later, by a peer's entry, is reported through Game::on_complete.
  bool enter(int r) {
    game_.on_enter(r);
    Rank& R = ranks_[r];
    R.entered = true;
    const int n = game_.op_count(r);
    R.matched.assign(n, 0);
    R.pending = 0;
    for (int i = 0; i < n; ++i)
      if (game_.op_kind(r, i) != PlayKind::Local) ++R.pending;
    current_ = r;  // its own completion is the caller's, after every op was tried
    for (int i = 0; i < n && R.pending > 0; ++i) {
      const PlayKind k = game_.op_kind(r, i);
      if (k == PlayKind::Local || R.matched[i]) continue;
      const int q = game_.op_peer(r, i);
      const Rank& Q = ranks_[q];
      if (Q.done || !Q.entered) continue;  // Q's entry will find this op
      const int qi = game_.find_op(q, k == PlayKind::Send ? PlayKind::Recv : PlayKind::Send, r, Q.matched);
      if (qi < 0) continue;
      if (k == PlayKind::Send) transfer(r, i, q, qi);
      else transfer(q, qi, r, i);
    }
    current_ = -1;
    return R.pending == 0;
  }

  // Rank r left its finished step (its next enter() is the next step's), or has no step left.
  void leave(int r) { ranks_[r].entered = false; }
  void finish(int r) {
    ranks_[r].entered = false;
    ranks_[r].done = true;
  }

  bool done(int r) const { return ranks_[r].done; }
  int pending(int r) const { return ranks_[r].pending; }

  // "" when every rank finished, else why the first rank that did not is stuck:
  // "deadlock: rank 0 stuck in step 2 waiting for receive from rank 1 (which is in step 3)".
  std::string deadlock() const {
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      const Rank& R = ranks_[r];
      if (R.done) continue;
      std::string msg = "deadlock: rank " + std::to_string(r) + " stuck in step " +
                        std::to_string(game_.step_of(r)) + " waiting for";
      for (int i = 0; i < static_cast<int>(R.matched.size()); ++i) {
        const PlayKind k = game_.op_kind(r, i);
        if (R.matched[i] || k == PlayKind::Local) continue;
        const int q = game_.op_peer(r, i);
        msg += std::string(" ") + (k == PlayKind::Send ? "send to" : "receive from") + " rank " +
               std::to_string(q) + " (" +
               (ranks_[q].done ? std::string("which has finished")
                               : "which is in step " + std::to_string(game_.step_of(q))) +
               ")";
        break;
      }
      return msg;
    }
    return "";
  }

 private:
  struct Rank {
    bool entered = false, done = false;
    int pending = 0;
    std::vector<uint8_t> matched;  // per op of the current step
  };

  void transfer(int s, int si, int q, int qi) {
    game_.on_transfer(s, si, q, qi);
    Rank& S = ranks_[s];
    Rank& Q = ranks_[q];
    S.matched[si] = 1;
    Q.matched[qi] = 1;
    if (--S.pending == 0 && s != current_) game_.on_complete(s);
    if (--Q.pending == 0 && q != current_) game_.on_complete(q);
  }

  Game& game_;
  std::vector<Rank> ranks_;
  int current_ = -1;
};

}  // namespace sched
}  // namespace commlib
