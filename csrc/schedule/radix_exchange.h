// all_reduce by recursive quartering, rail_window's inter-host phase "radix4" (session 33;
// docs/simulator.md "Session 33"): rabenseifner (all_reduce_recursive.cc) with groups of four ranks a
// round instead of pairs. A round's rank sends three quarters of its range, one to each of the three
// others of its group, and keeps the fourth, reduced from its own and three received parts (the first
// reduced as it arrives, the other two received into scratch and reduced after, in two local steps);
// the all-gather mirrors it. log4 P rounds each way instead of log2 P (one round of two where log2 P
// is odd), each rank's bytes the same, three messages a round instead of one: at 1024 hosts a
// segment's chain across the hosts is 2 x 5 rounds instead of 2 x 10. Each block is finished on one
// rank and copied to the others (deterministic). Not registered (auto would rank it as a flat and as
// every hierarchical composition's inter-host phase): rail_window's segments take it by
// CollArgs::inter_algorithm; internal to csrc/schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "schedule/ir.h"
#include "schedule/subgroup.h"

namespace commlib {
namespace sched {

// One rank's schedule of all_reduce over a.size ranks (a power of two; std::invalid_argument naming
// inter_algorithm otherwise), a.count elements.
Schedule all_reduce_radix4(const CollArgs& a);

// A sub-schedule built for the sub-group's own numbering (one lane) rewritten into the parent's
// terms, as on_subgroup does with a registered algorithm's (subgroup.cc).
Schedule rebased_on(Schedule s, const Subgroup& g);

struct Layout;
// hierarchical_layout.h's inter_phase (segment t, one piece) by all_reduce_radix4 on each block's
// owners: the steps, scratch from x_base; raises scratch_end to cover it.
std::vector<Step> radix4_inter_phase(const Layout& y, int t, int64_t x_base, int64_t& scratch_end);

}  // namespace sched
}  // namespace commlib
