// Lanes proven independent (verifier_lanes.h).
#include "verify/verifier_lanes.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#include "verify/verifier.h"
#include "verify/verifier_layout.h"

namespace commlib {

namespace {

using Interval = std::pair<int64_t, int64_t>;  // [first, end) in the rank's arena

// Sorted, overlapping intervals merged.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& x : v) {
    if (x.first >= x.second) continue;
    if (!out.empty() && x.first <= out.back().second) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

// The first element both sorted, merged lists hold, or -1.
int64_t first_common(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo < hi) return lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return -1;
}

size_t lane_of(const Schedule& s, size_t step) { return static_cast<size_t>(s.steps[step].lane); }

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw VerificationError(label + ": lanes: " + what);
}

// A pair's messages match first in, first out in list order (ir.h): the n-th send from s to q is
// q's n-th receive from s; both must be in one lane.
void check_messages(const std::vector<Schedule>& per_rank, const std::string& label) {
  std::map<std::pair<int, int>, std::vector<size_t>> sends, recvs;  // (from, to) -> lanes, in order
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r)
    for (size_t i = 0; i < per_rank[r].steps.size(); ++i)
      for (const Op& o : per_rank[r].steps[i].ops) {
        const size_t lane = lane_of(per_rank[r], i);
        if (o.kind == OpKind::Send) sends[{r, o.peer}].push_back(lane);
        else if (o.kind == OpKind::Recv || o.kind == OpKind::RecvReduce) recvs[{o.peer, r}].push_back(lane);
        else if (is_one_sided(o.kind) || is_sync(o.kind))
          fail(label, "rank " + std::to_string(r) + " step " + std::to_string(i) + " has a one-sided op (lanes are for messages)");
      }
  for (const auto& [pair, s_lanes] : sends) {
    const auto it = recvs.find(pair);
    if (it == recvs.end()) continue;  // the replay reports the unmatched send
    const std::vector<size_t>& r_lanes = it->second;
    for (size_t n = 0; n < std::min(s_lanes.size(), r_lanes.size()); ++n)
      if (s_lanes[n] != r_lanes[n])
        fail(label, "rank " + std::to_string(pair.first) + "'s send " + std::to_string(n) + " to rank " +
                        std::to_string(pair.second) + " (lane " + std::to_string(s_lanes[n]) +
                        ") is received in lane " + std::to_string(r_lanes[n]) + ": a message crosses lanes");
  }
}

// No element written by one lane and read or written by another, on rank r in one layout.
void check_footprints(Collective c, const Schedule& s, int P, int r, int root, int64_t count, int lanes,
                      bool in_place, const std::string& label) {
  const verify::Layout y = verify::make_layout(c, P, r, root, count, s.scratch_count, in_place);
  std::vector<std::vector<Interval>> writes(lanes), touches(lanes);  // touches: reads and writes
  auto add = [&](const Region& g, int lane, bool write) {
    if (g.count <= 0) return;
    const int64_t a = y.base[static_cast<int>(g.buf)] + g.offset;
    touches[lane].emplace_back(a, a + g.count);
    if (write) writes[lane].emplace_back(a, a + g.count);
  };
  for (size_t i = 0; i < s.steps.size(); ++i)
    for (const Op& o : s.steps[i].ops) {
      if (op_has_dst(o)) add(o.dst, static_cast<int>(lane_of(s, i)), true);
      if (op_has_src(o)) add(o.src, static_cast<int>(lane_of(s, i)), false);
    }
  for (int l = 0; l < lanes; ++l) writes[l] = merged(std::move(writes[l])), touches[l] = merged(std::move(touches[l]));
  for (int a = 0; a < lanes; ++a)
    for (int b = 0; b < lanes; ++b) {
      if (a == b) continue;
      const int64_t at = first_common(writes[a], touches[b]);
      if (at >= 0)
        fail(label, "rank " + std::to_string(r) + (in_place ? " (in place)" : "") + ": lane " + std::to_string(a) +
                        " writes arena element " + std::to_string(at) + " that lane " + std::to_string(b) +
                        " also reads or writes");
    }
}

}  // namespace

void check_lanes(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count, int root, int lanes,
                 const std::string& label) {
  if (lanes < 1) throw std::invalid_argument("lanes: must be >= 1, got " + std::to_string(lanes));
  if (lanes == 1) return;  // one lane: list order, whatever the steps' lane fields say
  for (int r = 0; r < size; ++r) {
    const Schedule& s = per_rank[r];
    if (s.window < 0 || s.window != per_rank[0].window)
      fail(label, "rank " + std::to_string(r) + " has window " + std::to_string(s.window) + ", rank 0 " +
                      std::to_string(per_rank[0].window) + " (one window >= 0 for every rank)");
    if (s.intra_window < 0 || s.intra_window != per_rank[0].intra_window)
      fail(label, "rank " + std::to_string(r) + " has intra window " + std::to_string(s.intra_window) + ", rank 0 " +
                      std::to_string(per_rank[0].intra_window) + " (one intra window >= 0 for every rank)");
    for (size_t i = 0; i < s.steps.size(); ++i)
      if (s.steps[i].lane < 0 || s.steps[i].lane >= lanes)
        fail(label, "rank " + std::to_string(r) + " step " + std::to_string(i) + " is in lane " +
                        std::to_string(s.steps[i].lane) + ", outside the schedule's " + std::to_string(lanes) + " lanes");
  }
  check_messages(per_rank, label);
  for (int r = 0; r < size; ++r) {
    check_footprints(c, per_rank[r], size, r, root, count, lanes, false, label);
    if (collective_has_in_place(c)) check_footprints(c, per_rank[r], size, r, root, count, lanes, true, label);
  }
}

void assign_contiguous_lanes(std::vector<Schedule>& per_rank, int lanes, const std::string& label) {
  if (lanes < 1) throw std::invalid_argument("lanes: must be >= 1, got " + std::to_string(lanes));
  for (size_t r = 0; r < per_rank.size(); ++r) {
    Schedule& s = per_rank[r];
    if (s.steps.size() % lanes != 0)
      fail(label, "rank " + std::to_string(r) + " has " + std::to_string(s.steps.size()) + " steps, not " +
                      std::to_string(lanes) + " lanes of equal length");
    for (size_t i = 0; i < s.steps.size(); ++i) s.steps[i].lane = static_cast<int>(i * lanes / s.steps.size());
  }
}

}  // namespace commlib
