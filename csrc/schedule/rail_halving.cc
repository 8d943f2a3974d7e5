// rail_halving all_reduce: hierarchical all_reduce whose phases halve and double, so that few steps
// keep every NIC and every NVLink port busy at once (issue 39).
//
//   intra-host  reduce-scatter by recursive halving (log L rounds, each reducing as it arrives),
//               all-gather by recursive doubling (log L rounds), each on the host's ranks;
//   inter-host  per rail: the owners of block i (local rank i of every host, one NIC each) all-reduce
//               it by rabenseifner (log H halving steps, then log H doubling steps): 2 log H
//               messages per rank and segment instead of a ring's 2(H-1) or two_shot's 2(H-1) peers,
//               at the same bandwidth-optimal volume (2(H-1)/H of the block through each NIC).
//
// Segment by segment the phases overlap as hierarchical's overlapped pipeline does
// (hierarchical_overlap.cc): tick t runs the reduce-scatter of segment t+1, the inter-host
// all-reduce of segment t and the all-gather of segment t-1. Both lanes halve then double: the
// reduce-scatter's rounds move L/2, L/4, .. blocks and the inter lane's halving steps 1/2, 1/4, .. of
// a block through a NIC, which on a rail-optimised host (one NIC per local rank, about 1/L of a
// port's rate each) take about the same time; so the reduce-scatter runs first in the tick and the
// lanes pair by their steps' elements (OverlapShape::by_elements), the round of the largest
// messages beside the step of the largest, where pairing by count would put the inter lane's
// largest step beside the all-gather's smallest round.
//
// CollArgs::share is the ramp (hierarchical_layout.h, Layout): 0 equal segments; R the first and the
// last segment cut in R + 1, halving towards the ends (docs/simulator.md "Session 23").
//
// Where that shape does not apply (one host, hosts of unequal or non-power-of-two size, one
// segment) it is hierarchical with rabenseifner between hosts and ring inside them
// (hierarchical_all_reduce.cc), which every host map runs.
#include <stdexcept>
#include <string>

#include "schedule/builders.h"
#include "schedule/hierarchical_layout.h"
#include "schedule/rail_halving.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

// (rabenseifner folds otherwise, and a folded rank's lane would pair differently from its group's.)
bool halving_hosts(const HostMap& m) {
  if (m.H() < 2 || !power_of_two(m.H()) || m.L(0) < 2 || !power_of_two(m.L(0))) return false;
  for (int g = 1; g < m.H(); ++g)
    if (m.L(g) != m.L(0)) return false;
  return true;
}

Schedule all_reduce_rail_halving(const CollArgs& a) {
  if (a.share < 0 || a.share > kMaxRamp)
    throw std::invalid_argument("share: rail_halving's ramp must be in [0, " + std::to_string(kMaxRamp) + "], got " +
                                std::to_string(a.share));
  CollArgs b = a;
  b.share = 0;
  b.inter_algorithm = "rabenseifner";
  const HostMap m(b);
  if (halving_hosts(m)) {
    const Layout y(b, m, pipeline_segments(b, m), a.share);
    OverlapShape shape;
    shape.rs_first = shape.by_elements = true;
    shape.intra_rs = "recursive_halving";
    shape.intra_ag = "recursive_doubling";
    if (Schedule s = all_reduce_overlapped(b, y, shape); !s.steps.empty()) return s;
  }
  b.intra_algorithm = m.H() >= 2 ? "ring" : "";
  return build_schedule(b, "hierarchical");
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "rail_halving", all_reduce_rail_halving, 13, kLargeMessages,
                           "hierarchical, halving and doubling inside hosts and per rail across them, pipelined");

}  // namespace sched
}  // namespace commlib
