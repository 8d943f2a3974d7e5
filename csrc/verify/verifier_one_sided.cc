// The replay of one-sided schedules (verifier_replay.h, ir.h "One-sided operations"). Ranks run
// their steps in any order the signals allow (a step starts once every wait of it has a signal to
// consume): the values a race-free schedule computes do not depend on that order, and the
// hazards (verifier_hazards.h) are what proves it race-free. Then every signal must have been
// consumed and no rank may return while a peer can still touch its buffers.
#include "verify/verifier_replay.h"

#include <algorithm>

namespace commlib {
namespace verify {

std::string Replay::arena_name(int owner, int64_t pos) const {
  const Layout& L = ranks_[owner].L;
  for (BufferId b : {BufferId::Output, BufferId::Input, BufferId::Scratch}) {
    const int i = static_cast<int>(b);
    if (L.size[i] > 0 && pos >= L.base[i] && pos < L.base[i] + L.size[i])
      return "rank " + std::to_string(owner) + "'s " + buffer_name(b) + "[" + std::to_string(pos - L.base[i]) + "]";
  }
  return "rank " + std::to_string(owner) + "'s arena[" + std::to_string(pos) + "]";
}

std::string Replay::access_str(const Access& a) const {
  if (a.time == 0) return "rank " + std::to_string(a.rank) + "'s use of its buffers before the call";
  return std::string("rank ") + std::to_string(a.rank) + "'s " + (a.write ? "write" : "read") + " in its step " +
         std::to_string(a.time - 1);
}

void Replay::access(int r, size_t st, int oi, int owner, const Region& g, bool write) {
  Access prior;
  int64_t pos = 0;
  if (hazards_.access(owner, abs(owner, g), g.count, r, ranks_[r].clock, write, &prior, &pos)) return;
  const std::string kind = prior.write ? (write ? "write-after-write" : "read-after-write") : "write-after-read";
  const std::string fix =
      prior.rank == r ? "two ops of one step touch it (they run concurrently)"
      : !write        ? "no signal from rank " + std::to_string(prior.rank) + " (or a chain of them) orders it after that: a signal/wait is missing"
                      : "rank " + std::to_string(prior.rank) + " must signal once done with it, and this rank wait for that signal first";
  fail(where(r, st, oi) + (write ? " writes " : " reads ") + arena_name(owner, pos) + " unordered with " +
       access_str(prior) + " (" + kind + " hazard: " + fix + ")");
}

// reduce_to_all (ir.h): every rank's src read, reduced in rank order 0..P-1, the result written
// into every rank's dst (reduce_from_all: into r's only). Where a written dst is its rank's src (in
// place) the read and the write are one access of this op, recorded as the write (as get_reduce's
// destination); a part overlap is a race inside the op.
void Replay::reduce_to_all(int r, size_t st, int oi, const Op& o) {
  const bool everywhere = o.kind == OpKind::ReduceToAll;
  for (int q = 0; q < P_; ++q) {
    const bool writes = everywhere || q == r;
    const int64_t s = abs(q, o.src), d = abs(q, o.dst);
    if (writes && s != d && s < d + o.dst.count && d < s + o.src.count)
      fail(where(r, st, oi) + ": its source and destination overlap in rank " + std::to_string(q) + "'s buffers" +
           (in_place_ ? " (in-place aliasing)" : ""));
    if (!writes || s != d) access(r, st, oi, q, o.src, false);
  }
  for (int q = 0; q < P_; ++q)
    if (everywhere || q == r) access(r, st, oi, q, o.dst, true);
  ranks_[0].mem.read(abs(0, o.src), o.src.count, pc_);
  for (int q = 1; q < P_; ++q) {  // every read before any write: in place the dst is the src
    ranks_[q].mem.read(abs(q, o.src), o.src.count, pa_);
    verify::combine_pieces(sets_, pc_, pa_, pb_);
    pc_.swap(pb_);
  }
  for (int q = 0; q < P_; ++q)
    if (everywhere || q == r) ranks_[q].mem.write(abs(q, o.dst), o.dst.count, pc_);
}

// Whether every wait of r's current step has a signal to consume (its waits, counted per flag, are
// kept in Rank::waits for run_one_sided_step).
bool Replay::step_ready(int r) {
  Rank& R = ranks_[r];
  if (R.waits_of != R.step) {  // a blocked rank is asked again after every round
    R.waits_of = R.step;
    R.waits.clear();
    for (const Op& o : sch_[r].steps[R.step].ops)
      if (o.kind == OpKind::Wait) R.waits.emplace_back(signal_key(o.peer, r, o.tag), 1);
    std::sort(R.waits.begin(), R.waits.end());
    size_t k = 0;
    for (size_t i = 0; i < R.waits.size(); ++i) {  // merge equal keys
      if (k > 0 && R.waits[k - 1].first == R.waits[i].first) ++R.waits[k - 1].second;
      else R.waits[k++] = R.waits[i];
    }
    R.waits.resize(k);
  }
  for (const auto& [key, need] : R.waits) {
    const auto posted = signals_.find(key);
    const auto used = consumed_.find(key);
    const size_t have = (posted == signals_.end() ? 0 : posted->second.size()) - (used == consumed_.end() ? 0 : used->second);
    if (have < need) return false;
  }
  return true;
}

void Replay::run_one_sided_step(int r) {
  Rank& R = ranks_[r];
  const size_t st = R.step;
  const auto& ops = sch_[r].steps[st].ops;
  R.clock[r] = static_cast<int64_t>(st) + 1;
  for (const auto& [key, need] : R.waits) {  // waits first: the clocks their signals carried join this rank's
    size_t& used = consumed_[key];
    const std::vector<uint32_t>& posted = signals_[key];
    for (uint32_t i = 0; i < need; ++i) {
      const std::vector<int64_t>& c = clocks_[posted[used++]];
      for (int q = 0; q < P_; ++q) R.clock[q] = std::max(R.clock[q], c[q]);
    }
  }
  for (int oi = 0; oi < static_cast<int>(ops.size()); ++oi) {  // then the data ops
    const Op& o = ops[oi];
    switch (o.kind) {
      case OpKind::Copy:
        if (noop_copy(r, o)) break;
        access(r, st, oi, r, o.src, false);
        access(r, st, oi, r, o.dst, true);
        R.mem.read(abs(r, o.src), o.src.count, pa_);
        R.mem.write(abs(r, o.dst), o.dst.count, pa_);
        break;
      case OpKind::Reduce:
      case OpKind::Get:
      case OpKind::GetReduce: {
        const int from = o.kind == OpKind::Reduce ? r : o.peer;
        access(r, st, oi, from, o.src, false);
        access(r, st, oi, r, o.dst, true);
        ranks_[from].mem.read(abs(from, o.src), o.src.count, pa_);
        if (o.kind == OpKind::Get) {
          R.mem.write(abs(r, o.dst), o.dst.count, pa_);
          break;
        }
        R.mem.read(abs(r, o.dst), o.dst.count, pb_);
        verify::combine_pieces(sets_, pb_, pa_, pc_);
        R.mem.write(abs(r, o.dst), o.dst.count, pc_);
        break;
      }
      case OpKind::ReduceToAll:
      case OpKind::ReduceFromAll:
        reduce_to_all(r, st, oi, o);
        break;
      case OpKind::Put:
        access(r, st, oi, r, o.src, false);
        access(r, st, oi, o.peer, o.dst, true);
        R.mem.read(abs(r, o.src), o.src.count, pa_);
        ranks_[o.peer].mem.write(abs(o.peer, o.dst), o.dst.count, pa_);
        break;
      default: break;
    }
  }
  bool signalled = false;
  for (const Op& o : ops) {  // then the signals, carrying everything up to here
    if (o.kind != OpKind::Signal) continue;
    if (!signalled) clocks_.push_back(R.clock);
    signalled = true;
    signals_[signal_key(r, o.peer, o.tag)].push_back(static_cast<uint32_t>(clocks_.size() - 1));
  }
  ++R.step;
  if (trace_) record(r);  // a put shows in its target's holdings at the target's next recorded step
}

void Replay::play_one_sided() {
  std::vector<int64_t> arena(P_);
  for (int r = 0; r < P_; ++r) {
    arena[r] = ranks_[r].L.arena;
    ranks_[r].clock.assign(P_, -1);
    ranks_[r].clock[r] = 0;
  }
  hazards_.init(arena);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P_; ++r)
      while (ranks_[r].step < sch_[r].steps.size() && step_ready(r)) {
        run_one_sided_step(r);
        progress = true;
      }
  }
  for (int r = 0; r < P_; ++r) {
    const Rank& R = ranks_[r];
    if (R.step >= sch_[r].steps.size()) continue;
    const auto& ops = sch_[r].steps[R.step].ops;
    for (const Op& o : ops) {  // the first wait short of signals
      if (o.kind != OpKind::Wait) continue;
      const int64_t key = signal_key(o.peer, r, o.tag);
      const size_t posted = signals_.count(key) ? signals_[key].size() : 0, used = consumed_[key];
      size_t waits = 0;
      for (const Op& w : ops) waits += w.kind == OpKind::Wait && w.peer == o.peer && w.tag == o.tag;
      if (posted - used >= waits) continue;
      const Rank& Q = ranks_[o.peer];
      fail("deadlock: rank " + std::to_string(r) + " stuck in step " + std::to_string(R.step) + " waiting for " +
           std::to_string(waits) + " signal(s) from rank " + std::to_string(o.peer) + " (tag " + std::to_string(o.tag) +
           "; " + std::to_string(posted) + " posted, " + std::to_string(used) + " consumed before this step; rank " +
           std::to_string(o.peer) +
           (Q.step >= sch_[o.peer].steps.size() ? " has finished)" : " is in step " + std::to_string(Q.step) + ")"));
    }
  }
  for (const auto& [key, clocks] : signals_) {
    const size_t used = consumed_[key];
    if (used == clocks.size()) continue;
    const int tag = static_cast<int>(key % kSignalTags), to = static_cast<int>(key / kSignalTags % P_),
              from = static_cast<int>(key / kSignalTags / P_);
    fail("rank " + std::to_string(from) + " signals rank " + std::to_string(to) + " (tag " + std::to_string(tag) +
         ") " + std::to_string(clocks.size()) + " times but rank " + std::to_string(to) + " waits " +
         std::to_string(used) + " times (the flag would be off by the difference in the next call)");
  }
  for (int r = 0; r < P_; ++r) {
    std::vector<int64_t> exit = ranks_[r].clock;
    exit[r] = static_cast<int64_t>(sch_[r].steps.size()) + 1;
    Access prior;
    int64_t pos = 0;
    if (!hazards_.release(r, exit, &prior, &pos))
      fail("rank " + std::to_string(r) + " returns (its caller may reuse " + arena_name(r, pos) +
           ") unordered with " + access_str(prior) + " (write-after-read hazard at the end: rank " +
           std::to_string(prior.rank) + " must signal once done with it, and rank " + std::to_string(r) +
           " wait for that signal before returning)");
  }
}

}  // namespace verify
}  // namespace commlib
