// Schedules side by side on shares of one buffer, and rail_split: rail rings beside pipelined
// hierarchical (side_by_side.h).
#include "schedule/side_by_side.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/lanes.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

void move_region(Region& r, int64_t offset, int64_t scratch_base) {
  r.offset += r.buf == BufferId::Scratch ? scratch_base : offset;
}

}  // namespace

int64_t share_of(int64_t count, int share) {
  return count / kShareUnits * share + count % kShareUnits * share / kShareUnits;
}

std::vector<Step> interleave_rounds(std::vector<std::vector<Step>> parts) {
  struct At {
    size_t round, part, index;
  };
  std::vector<At> order;
  for (size_t p = 0; p < parts.size(); ++p) {
    std::vector<size_t> seen;  // per lane: its steps so far in this part
    for (size_t i = 0; i < parts[p].size(); ++i) {
      const size_t lane = static_cast<size_t>(parts[p][i].lane);
      if (seen.size() <= lane) seen.resize(lane + 1, 0);
      order.push_back(At{seen[lane]++, p, i});
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const At& x, const At& y) { return x.round < y.round; });
  std::vector<Step> out;
  for (const At& at : order)
    if (!parts[at.part][at.index].ops.empty()) out.push_back(std::move(parts[at.part][at.index]));
  return out;
}

namespace {

// Each part built for its share, its regions moved there and its scratch past the parts before it
// (s.scratch_count: their total); `keep_empty`: parts of count 0 too.
std::vector<std::vector<Step>> moved_parts(const CollArgs& a, const std::vector<Part>& parts, bool keep_empty,
                                           Schedule& s) {
  if (a.coll != Collective::AllReduce && a.coll != Collective::Broadcast && a.coll != Collective::Reduce)
    throw std::invalid_argument(std::string("side_by_side: ") + collective_name(a.coll) +
                                " has no one-buffer shape to share");
  const bool any = std::any_of(parts.begin(), parts.end(), [](const Part& p) { return p.count > 0; });
  std::vector<std::vector<Step>> lanes;
  for (const Part& p : parts) {
    if (any && p.count == 0 && !keep_empty) continue;
    CollArgs pa = a;
    pa.count = p.count;
    Schedule part = build_schedule(pa, p.how);
    for (Step& st : part.steps)
      for (Op& o : st.ops) {
        if (op_has_dst(o)) move_region(o.dst, p.offset, s.scratch_count);
        if (op_has_src(o)) move_region(o.src, p.offset, s.scratch_count);
      }
    s.scratch_count += part.scratch_count;
    lanes.push_back(std::move(part.steps));
  }
  return lanes;
}

}  // namespace

Schedule side_by_side(const CollArgs& a, const std::vector<Part>& parts, bool lock_step) {
  Schedule s;
  std::vector<std::vector<Step>> lanes = moved_parts(a, parts, true, s);
  int base = 0;  // the lanes of the parts before
  for (size_t p = 0; p < lanes.size(); ++p) {
    CollArgs pa = a;
    pa.count = parts[p].count;
    pa.compose(parts[p].how);
    const int w = schedule_lanes(pa, parts[p].how.algorithm);
    for (Step& st : lanes[p]) st.lane = w > 1 ? st.lane + base : base;  // (one lane: whatever its fields say)
    base += w;
  }
  if (lock_step) {
    s.steps = interleave_rounds(std::move(lanes));
  } else {
    for (auto& lane : lanes)
      for (Step& st : lane)
        if (!st.ops.empty()) s.steps.push_back(std::move(st));
  }
  return s;
}

int side_by_side_lanes(const CollArgs& a, const std::vector<Part>& parts) {
  int W = 0;
  for (const Part& p : parts) {
    CollArgs pa = a;
    pa.count = p.count;
    pa.compose(p.how);
    W += schedule_lanes(pa, p.how.algorithm);
  }
  return W;
}

Schedule lane_parts(const CollArgs& a, const std::vector<Part>& parts) {
  Schedule s;
  const std::vector<std::vector<Step>> lanes = moved_parts(a, parts, true, s);
  size_t len = 1;  // every lane at least one step (so that W divides the steps)
  for (const auto& l : lanes) len = std::max(len, l.size());
  for (size_t c = 0; c < lanes.size(); ++c) {
    const size_t first = s.steps.size();
    s.steps.insert(s.steps.end(), lanes[c].begin(), lanes[c].end());
    s.steps.resize(first + len);  // empty steps to the lane's length
    for (size_t k = first; k < s.steps.size(); ++k) s.steps[k].lane = static_cast<int>(c);
  }
  return s;
}

namespace {

// Whether hierarchical all_reduce is in lock step (side_by_side.h) on H equal hosts with `inter`
// between them: the built-in exchange and the inter algorithms whose every rank takes the same steps
// are at any H (every intra algorithm keeps it: its rounds are aligned, hierarchical_overlap.cc); the
// power-of-two ones fold at other H, so a folded owner's inter steps fall elsewhere in its ticks than
// its partner's; the trees (tree, double_tree, reduce_broadcast) are not at any H (a parent waits on
// its children in steps of its own). A registered
// intra algorithm keeps it once every segment has a few elements per rank (below 2 P elements in all
// some ranks' ranges are empty and skip rounds): `count` (the part's) at least 32 P, 16 segments of
// 2 P. Found by playing every composition's schedules at counts 0..3 P + 1 and larger, on 2-4 hosts
// of 2-8 (tests/schedule/test_rail_ring.py proves rail_split on each host map it sweeps). It is on
// the safe side: comparing each pair's send and receive step indices of the built hierarchical
// schedules (4x4, 3x2, 2x4, 3x4 hosts, count 64 P + 7, every inter algorithm) finds no part it
// merges that is out of lock step, but some it runs one after another that are in it (every intra
// algorithm at that count, double_tree on 2 hosts). Deriving it per call would build every rank's
// part in each rank's build (P builds a rank: too slow for the simulator's 1024+ ranks).
bool hierarchical_in_lock_step(const CollArgs& a, int64_t count, int hosts) {
  if (!a.intra_algorithm.empty() && count < 32 * static_cast<int64_t>(a.size)) return false;
  const std::string& inter = a.inter_algorithm;
  for (const char* any : {"", "ring", "two_shot", "direct", "grid", "rail_ring"})
    if (inter == any) return true;
  for (const char* pow2 : {"rabenseifner", "recursive_doubling"})
    if (inter == pow2) return is_pow2(hosts);
  return false;
}

// rail_split's parts: the rail rings on the first share, hierarchical on the rest.
std::vector<Part> split_parts(const CollArgs& a) {
  const int64_t rails = share_of(a.count, a.share > 0 ? a.share : kDefaultShare);
  return {{Composition{"rail_ring"}, 0, rails},
          {Composition{"hierarchical", a.inter_algorithm, a.intra_algorithm, a.segment, a.pieces}, rails,
           a.count - rails}};
}

// rail_split: the rail rings (rail_ring.cc) on the first share / kShareUnits of the buffer, the
// hierarchical schedule of CollArgs's phases, segment and pieces on the rest, side by side where both
// are in lock step (hosts of equal size, and an inter algorithm that keeps it), one after another
// elsewhere.
Schedule all_reduce_rail_split(const CollArgs& a) {
  if (a.share < 0 || a.share > kShareUnits)
    throw std::invalid_argument("share: must be in [0, " + std::to_string(kShareUnits) + "], got " +
                                std::to_string(a.share));
  const int64_t rails = share_of(a.count, a.share > 0 ? a.share : kDefaultShare);
  const HostMap m(a);
  bool equal = true;
  for (int h = 1; h < m.H(); ++h) equal = equal && m.L(h) == m.L(0);
  const std::vector<Part> parts = split_parts(a);
  return side_by_side(a, parts, equal && hierarchical_in_lock_step(a, a.count - rails, m.H()));
}

int rail_split_lanes(const CollArgs& a) { return a.share < 0 || a.share > kShareUnits ? 1 : side_by_side_lanes(a, split_parts(a)); }

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllReduce, "rail_split", all_reduce_rail_split, 12, kLargeMessages,
                           "rail rings on a share of the buffer beside hierarchical on the rest, each channel a lane");
static const LanesRegistrar rail_split_lanes_count(Collective::AllReduce, "rail_split", rail_split_lanes);

}  // namespace sched
}  // namespace commlib
