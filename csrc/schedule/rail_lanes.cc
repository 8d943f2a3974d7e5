// rail_lanes all_reduce: rail_halving (rail_halving.cc) in W lanes (schedule/lanes.h): the buffer in
// W shares, each share's pipelined rail_halving in its own lane, so that a share's step starts when
// its own previous step is done, not when every share's is (slices in flight, as NCCL's channels:
// docs/simulator.md "Slices in flight"). In one lane rail_halving's steps wait for the slowest of
// their messages, and its small steps (the halving's last, the doubling's first: 1/2^k of a block,
// shorter than a message's latency at 16 nodes and more) leave the NICs idle for a latency each;
// with W lanes a lane's latency is another's transfer.
//
// The composition's `pieces` is the lane count W (0: kDefaultLanes; at most kMaxLanes), its
// `segment` each lane's pipeline segment (a lane of n / W elements runs n / W / segment of them, at
// most 16: count / segment in all, at most 16 W), its `share` each lane's ramp (rail_halving.cc:
// the first and last segment of a lane cut smaller, so the lanes' common fill and drain shrink).
// Where rail_halving does not pair (one host, unequal or non-power-of-two hosts) or the buffer has
// fewer elements than lanes it is rail_halving in one lane.
#include <algorithm>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/lanes.h"
#include "schedule/rail_halving.h"
#include "schedule/registry.h"
#include "schedule/side_by_side.h"

namespace commlib {
namespace sched {

namespace {

constexpr int kDefaultLanes = 2;
constexpr int kMaxLanes = 8;

int rail_lanes_count(const CollArgs& a) {
  const int W = a.pieces > 0 ? std::min(a.pieces, kMaxLanes) : kDefaultLanes;
  return a.count >= W && halving_hosts(HostMap(a)) ? W : 1;
}

}  // namespace

Schedule all_reduce_rail_lanes(const CollArgs& a) {
  const int W = rail_lanes_count(a);
  CollArgs b = a;
  b.pieces = 0;
  if (W == 1) return build_schedule(b, "rail_halving");
  std::vector<Part> parts(W);
  for (int c = 0; c < W; ++c) {
    parts[c].how = Composition{"rail_halving", "", "", a.segment, 0, a.share};
    parts[c].offset = a.count / W * c + std::min<int64_t>(c, a.count % W);
    parts[c].count = a.count / W + (c < a.count % W ? 1 : 0);
  }
  return lane_parts(b, parts);
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "rail_lanes", all_reduce_rail_lanes, 14, kLargeMessages,
                           "rail_halving in lanes: each share's steps wait only for its own (slices in flight)");
static const LanesRegistrar rail_lanes_lanes(Collective::AllReduce, "rail_lanes", rail_lanes_count);

}  // namespace sched
}  // namespace commlib
