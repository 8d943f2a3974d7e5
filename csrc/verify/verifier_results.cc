// The replay's verdict (verifier_replay.h): each rank's output against what the collective must
// produce, and for all_reduce the same reduction order on every rank (bitwise-identical results).
#include "verify/verifier_replay.h"

namespace commlib {
namespace verify {

void Replay::check_results() {
  const int O = static_cast<int>(BufferId::Output);
  for (int r = 0; r < P_; ++r) {
    const Rank& R = ranks_[r];
    if (c_ == Collective::Barrier) {
      if (R.know != all_)
        fail("rank " + std::to_string(r) + " leaves the barrier having heard (directly or not) only from ranks " +
             sets_.str(R.know) + ", expected " + sets_.str(all_));
      continue;
    }
    if (R.L.size[O] < 0) continue;
    const int64_t m = R.L.size[O];
    R.mem.read(R.L.base[O], m, pa_);
    expected(r, pb_);
    for_each_overlap(pa_, pb_, [&](const Run& g, const Run& e, int64_t pos, int64_t) {
      const Val gv{src_at(g, pos), g.set}, ev{src_at(e, pos), e.set};
      if (gv.src != ev.src || gv.set != ev.set)
        fail("rank " + std::to_string(r) + " output[" + std::to_string(pos) + "]: expected " +
             verify::val_str(sets_, ev, "input") + ", got " + verify::val_str(sets_, gv, "input"));
    });
  }
  // With a codec every rank must also hold all_gather's blocks alike: v and Q(v) differ.
  if (c_ == Collective::AllReduce || (codec_ && c_ == Collective::AllGather)) check_same_order();
}

// Every rank must have reduced each element in the same order (same tree up to commutativity).
void Replay::check_same_order() {
  const int O = static_cast<int>(BufferId::Output);
  ranks_[0].mem.read(ranks_[0].L.base[O], ranks_[0].L.size[O], pc_);
  for (int r = 1; r < P_; ++r) {
    ranks_[r].mem.read(ranks_[r].L.base[O], ranks_[r].L.size[O], pa_);
    for_each_overlap(pa_, pc_, [&](const Run& g, const Run& e, int64_t pos, int64_t) {
      if (g.tree != e.tree)
        fail("rank " + std::to_string(r) + " output[" + std::to_string(pos) +
             (codec_ ? "] differs from rank 0's in its reduction order or in where the codec projected it"
                     : "] was reduced in a different order than on rank 0") +
             ", so the ranks would not end bitwise identical");
    });
  }
}

// Expected output of rank r as pieces.
void Replay::expected(int r, std::vector<Run>& out) {
  const int64_t n = n_, rn = static_cast<int64_t>(r) * n_;
  out.clear();
  switch (c_) {
    case Collective::AllReduce:
    case Collective::Reduce: push_merge(out, Run{0, n, 0, all_, 0}); break;
    case Collective::ReduceScatter: push_merge(out, Run{0, n, rn, all_, 0}); break;
    case Collective::AllGather:
    case Collective::Gather:
      for (int j = 0; j < P_; ++j) push_merge(out, Run{j * n, n, 0, sets_.single(j), 0});
      break;
    case Collective::AllToAll:
      for (int j = 0; j < P_; ++j) push_merge(out, Run{j * n, n, rn, sets_.single(j), 0});
      break;
    case Collective::Broadcast: push_merge(out, Run{0, n, 0, sets_.single(root_), 0}); break;
    case Collective::Scatter: push_merge(out, Run{0, n, rn, sets_.single(root_), 0}); break;
    default: break;
  }
}

}  // namespace verify
}  // namespace commlib
