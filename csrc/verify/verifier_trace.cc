// The verifier's step-by-step holdings (verifier.h, trace_schedules): the replay of
// verify_schedules, recording after every step what each buffer of the rank holds, as runs with
// their contributor sets spelled out as rank lists, for the schedule explorer (commlib explain).
#include "verify/verifier_replay.h"

namespace commlib {
namespace verify {

void Replay::record(int r) {
  const Rank& R = ranks_[r];
  std::array<HeldBuffer, 3> bufs;
  for (int b = 0; b < 3; ++b) {
    bufs[b].size = R.L.size[b];
    if (R.L.size[b] <= 0) continue;
    R.mem.read(R.L.base[b], R.L.size[b], pa_);
    for (const Run& run : pa_) {
      HeldRun h{run.start, run.len, run.src, {}};
      if (run.src != kUninit)
        for (int q = 0; q < P_; ++q)
          if (!sets_.disjoint(run.set, sets_.single(q))) h.ranks.push_back(q);
      bufs[b].runs.push_back(std::move(h));
    }
  }
  (*trace_)[r].push_back(std::move(bufs));
}

}  // namespace verify

Holdings trace_schedules(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count, int root,
                         const std::string& label) {
  if (size < 1 || size > 64) throw std::invalid_argument("size: the trace explains 1..64 ranks, got " + std::to_string(size));
  if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
  if (collective_has_root(c) && (root < 0 || root >= size))
    throw std::invalid_argument("root: " + std::to_string(root) + " out of range [0, " + std::to_string(size) + ")");
  if (c == Collective::Send || c == Collective::Recv || c == Collective::kCount)
    throw std::invalid_argument(std::string("collective: ") + collective_name(c) + " has no schedules");
  if (!collective_has_root(c)) root = 0;
  Holdings h(size);
  verify::Replay replay(c, per_rank, size, count, root, false, label);
  replay.trace_into(&h);
  replay.run();
  return h;
}

}  // namespace commlib
