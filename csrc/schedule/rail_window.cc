// rail_window all_reduce: the buffer in K segments, each segment's hierarchical all_reduce
// (rail_halving's plain form: a ring reduce-scatter inside the host, rabenseifner per rail across
// hosts, a ring all-gather inside the host) in a lane of its own (schedule/lanes.h), the lanes listed
// in pipelined order under a window of D steps in flight (ir.h Schedule::window: NCCL_STEPS'
// slices). rail_lanes' lanes each run a lock-step pipeline of their segments, so a lane's segments
// wait for each other's steps and a lane's chain of 2 log H inter steps a segment pays a latency a
// step K times over; here no segment waits for another's steps but through the window, so one
// segment's latency is another's transfer, and the fill and drain are one segment's
// (docs/simulator.md "A window of steps in flight").
//
// List order: segment p's step j at key p * stagger + j (ties: the lower segment first), so
// segment p + 1 is `stagger` steps behind segment p; the window lets step i start once step i - D
// of that list has finished, which keeps the lanes near that order (at most D steps in flight)
// while a slow step holds back only its own lane and the steps D after it. Run in list order it is
// correct too (every rank lists the same keys, and each segment's schedule is in lock step on the
// hosts where the lanes apply: the verifier's replay of the list proves it), which is how the
// engines without a window run it.
//
// The composition: `segment` elements a segment (K = count / segment, at most kMaxWindowLanes; 0: one
// segment), `pieces` the window D (0: one segment's steps), `share` the stagger (0: 1) in its low 16
// bits and a ramp R above them (share >> 16 & 0xff, session 27): the first and the last segment each cut in
// R + 1 lanes of 1/2^R, 1/2^R, 2/2^R, .., 1/2 of it (hierarchical_layout.h's ramp, here segments of
// their own), so the fill and the drain are a 1/2^R segment's while the steady segments, and so the
// inter-host messages a rank posts, stay K's (0: equal segments; a ramp whose smallest piece would
// hold fewer than kMinWindowSegment elements a rank, or that would pass kMaxWindowLanes, is left out),
// and above that (share >> 24, session 32) the intra window E (ir.h Schedule::intra_window: at most
// E of a rank's steps inside the host in flight, the oldest first; 0 none). CollArgs::inter_algorithm
// the segments' phase between the hosts (session 33): "" or "rabenseifner", or "radix4", recursive
// quartering (radix_exchange.h: log4 H rounds of three messages instead of log2 H of one).
// Where rail_halving does not pair (one host, unequal or non-power-of-two hosts) or a segment would
// hold fewer than kMinWindowSegment elements per rank, it is rail_halving's plain form in one lane.
#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/hierarchical_layout.h"
#include "schedule/lanes.h"
#include "schedule/radix_exchange.h"
#include "schedule/rail_halving.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

constexpr int kMaxWindowLanes = 256;  // (a run plays K lanes a rank: 128 win at 128 dgx-h100 nodes, 64 MiB)
constexpr int64_t kMinWindowSegment = 2;  // elements per rank a segment at least (every rank a block)

int equal_segments(const CollArgs& a) {
  if (a.segment <= 0 || !halving_hosts(HostMap(a))) return 1;
  const int64_t K = std::min<int64_t>(a.count / a.segment, kMaxWindowLanes);
  return K >= 2 && a.count / K >= kMinWindowSegment * a.size ? static_cast<int>(K) : 1;
}

// Each lane's segment, (offset, count) in list order: K equal segments, the first and last cut in
// R + 1 ramp pieces (the file's comment) where the ramp fits.
std::vector<std::pair<int64_t, int64_t>> window_segments(const CollArgs& a) {
  const int K = equal_segments(a);
  std::vector<std::pair<int64_t, int64_t>> seg;
  for (int p = 0; p < K; ++p)
    seg.emplace_back(a.count / K * p + std::min<int64_t>(p, a.count % K), a.count / K + (p < a.count % K ? 1 : 0));
  const int R = (a.share >> 16) & 0xff;
  if (K < 2 || R <= 0 || R > 16 || K + 2 * R > kMaxWindowLanes) return seg;
  const int64_t last = seg.back().second;  // (the shorter of the two lengths)
  if ((last >> R) < kMinWindowSegment * a.size) return seg;
  auto cut = [R](int64_t off, int64_t c, bool up) {  // 1/2^R, 1/2^R, 2/2^R, .., 1/2 (up), or reversed
    std::vector<int64_t> ends{0};
    for (int k = 1; k <= R; ++k) ends.push_back((c << (k - 1)) >> R);
    ends.push_back(c);
    std::vector<std::pair<int64_t, int64_t>> out;
    for (size_t i = 0; i + 1 < ends.size(); ++i) {
      const int64_t b = up ? ends[i] : c - ends[ends.size() - 1 - i];
      const int64_t e = up ? ends[i + 1] : c - ends[ends.size() - 2 - i];
      out.emplace_back(off + b, e - b);
    }
    return out;
  };
  std::vector<std::pair<int64_t, int64_t>> out = cut(seg.front().first, seg.front().second, true);
  out.insert(out.end(), seg.begin() + 1, seg.end() - 1);
  const auto tail = cut(seg.back().first, seg.back().second, false);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

int rail_window_lanes(const CollArgs& a) { return static_cast<int>(window_segments(a).size()); }

// The intra-host reduce-scatter and all-gather of a segment named by CollArgs::intra_algorithm: ""
// (rail_halving's plain form, ring), "recursive_halving" (its all-gather recursive doubling), or a
// name registered for both (direct, ring, ..).
std::pair<std::string, std::string> intra_pair(const std::string& name) {
  if (name.empty() || name == "ring") return {"ring", "ring"};
  if (name == "recursive_halving") return {"recursive_halving", "recursive_doubling"};
  if (!algorithm_registered(Collective::ReduceScatter, name) || !algorithm_registered(Collective::AllGather, name))
    throw std::invalid_argument("intra_algorithm: rail_window's segments take '', 'recursive_halving' or a name "
                                "registered for both reduce_scatter and all_gather, got '" + name + "'");
  return {name, name};
}

// One segment's schedule, `b` its call (segment, pieces and share cleared). CollArgs::intra_algorithm
// empty: rail_halving's plain form (ring reduce-scatter and all-gather inside the hosts). Otherwise
// those two phases by intra_pair's algorithms (session 29: recursive halving and doubling take log2 L
// rounds each, direct one, against the ring's L - 1, the same bytes through a port: a shorter fill,
// drain and chain a lane), rabenseifner per rail between them, the three phases one after another as
// hierarchical's composed form runs one segment (hierarchical_all_reduce.cc).
Schedule segment_schedule(CollArgs b) {
  const bool radix4 = b.inter_algorithm == "radix4";
  if (b.intra_algorithm.empty() && !radix4) return build_schedule(b, "rail_halving");
  const auto [rs, ag] = intra_pair(b.intra_algorithm);
  b.inter_algorithm = "rabenseifner";
  const HostMap m(b);
  const Layout y(b, m, 1);
  IntraPhases phases(y, rs, ag, 0);
  Schedule s;
  append_steps(s, phases.rs(0));
  append_steps(s, radix4 ? radix4_inter_phase(y, 0, 0, s.scratch_count) : inter_phase(b, y, 0, 0, s.scratch_count));
  append_steps(s, phases.ag(0));
  s.scratch_count = std::max(s.scratch_count, phases.scratch_end());
  return s;
}

}  // namespace

Schedule all_reduce_rail_window(const CollArgs& a) {
  if (a.pieces < 0) throw std::invalid_argument("pieces: rail_window's window must be >= 0, got " + std::to_string(a.pieces));
  if (a.share < 0) throw std::invalid_argument("share: rail_window's stagger must be >= 0, got " + std::to_string(a.share));
  intra_pair(a.intra_algorithm);  // (a bad name fails on every host map, one lane or many)
  if (!a.inter_algorithm.empty() && a.inter_algorithm != "rabenseifner" && a.inter_algorithm != "radix4")
    throw std::invalid_argument("inter_algorithm: rail_window's segments take '', 'rabenseifner' or 'radix4', got '" +
                                a.inter_algorithm + "'");
  const std::vector<std::pair<int64_t, int64_t>> segs = window_segments(a);
  const int K = static_cast<int>(segs.size());
  CollArgs b = a;
  b.segment = b.pieces = b.share = 0;
  if (K == 1) {  // rail_halving's plain form: one segment
    b.intra_algorithm.clear();
    b.inter_algorithm.clear();
    return build_schedule(b, "rail_halving");
  }
  // Lane p: segment p's schedule, its input and output regions moved to the segment, its scratch
  // past the segments before it, padded to the longest (as lane_parts, side_by_side.h), each of the
  // segment lengths (at most two, and the ramp's) built once: a build is O(P), and K of them a rank at 8192 ranks
  // were most of a simulation's time.
  std::map<int64_t, Schedule> built;
  std::vector<std::vector<Step>> lanes(K);
  Schedule laned;
  size_t n = 1;
  for (int p = 0; p < K; ++p) {
    const int64_t offset = segs[p].first;
    b.count = segs[p].second;
    auto it = built.find(b.count);
    if (it == built.end()) it = built.emplace(b.count, segment_schedule(b)).first;
    lanes[p] = it->second.steps;
    for (Step& st : lanes[p]) {
      for (Op& o : st.ops)
        for (Region* g : {op_has_dst(o) ? &o.dst : nullptr, op_has_src(o) ? &o.src : nullptr})
          if (g) g->offset += g->buf == BufferId::Scratch ? laned.scratch_count : offset;
    }
    laned.scratch_count += it->second.scratch_count;
    n = std::max(n, lanes[p].size());
  }
  for (int p = 0; p < K; ++p) {
    lanes[p].resize(n);  // (empty steps to the longest: dropped below)
    for (Step& st : lanes[p]) {
      st.lane = p;
      laned.steps.push_back(std::move(st));
    }
  }
  const int64_t stagger = (a.share & 0xffff) > 0 ? (a.share & 0xffff) : 1;
  std::vector<size_t> at(laned.steps.size());
  std::iota(at.begin(), at.end(), size_t{0});
  auto key = [&](size_t i) { return static_cast<int64_t>(i / n) * stagger + static_cast<int64_t>(i % n); };
  std::stable_sort(at.begin(), at.end(), [&](size_t x, size_t y) { return key(x) < key(y); });
  Schedule s;
  s.scratch_count = laned.scratch_count;
  for (size_t i : at)
    if (!laned.steps[i].ops.empty()) s.steps.push_back(std::move(laned.steps[i]));  // (padding dropped)
  s.window = a.pieces > 0 ? a.pieces : static_cast<int>(n);
  s.intra_window = a.share >> 24;
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "rail_window", all_reduce_rail_window, 15, kLargeMessages,
                           "rail_halving's segments each in a lane, pipelined under a window of steps in flight");
static const LanesRegistrar rail_window_lanes_count(Collective::AllReduce, "rail_window", rail_window_lanes);

}  // namespace sched
}  // namespace commlib
