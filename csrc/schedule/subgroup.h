// The sub-group combinator: one registered algorithm run by a subset of the ranks, as part of a
// larger schedule. The sub-schedule is built for the sub-group's own numbering (its ranks 0..n-1 are
// `members` in that order) and rewritten into the parent's terms: peers renumbered, and each of its
// three buffers re-based onto a region of the parent's buffers. Hierarchical schedules use it for
// their inter-host phase (any algorithm over the owners of a block) and, with
// CollArgs::intra_algorithm, their intra-host phases; internal to csrc/schedule.
#pragma once

#include <string>
#include <vector>

#include "schedule/ir.h"

namespace commlib {
namespace sched {

// Where one of the sub-schedule's buffers lives in the parent: element `offset` of buffer `buf`.
struct Rebase {
  BufferId buf = BufferId::Input;
  int64_t offset = 0;
};

struct Subgroup {
  std::vector<int> members;  // parent ranks, in sub-rank order
  Rebase input, output, scratch;
};

// The parent-rank schedule of `algorithm` for collective `coll` over `g.members` (the calling rank
// must be one of them), `count` and `root` in the sub-group's terms (ir.h). The result's
// scratch_count is the end of the scratch it uses in the parent's scratch buffer (0 if none).
// std::invalid_argument naming `what` (the CollArgs field that chose it: inter_algorithm or
// intra_algorithm) when the algorithm is unknown or hierarchical.
Schedule on_subgroup(Collective coll, const std::string& algorithm, int rank, int64_t count, int root,
                     const Subgroup& g, const char* what = "inter_algorithm");

// Appends `more`'s steps to `s` and raises s's scratch to cover more's.
void append_schedule(Schedule& s, const Schedule& more);

// Merges step lists that run side by side (disjoint regions, disjoint peers): step k of the result
// holds step k of each list; empty steps are dropped. Each list keeps its own order.
std::vector<Step> zip_steps(const std::vector<std::vector<Step>>& lists);

// A laned schedule's steps (schedule/lanes.h) as the steps of one lane: step k of the result holds
// every lane's k-th step (its round), lane by lane in list order, all in lane 0. Right for lanes in
// lock step (each message's two ends in the same round: rail_ring's channels); a phase of a
// hierarchical schedule runs so (on_subgroup), its lanes the concurrent ops of each step, as before
// the channels were lanes.
std::vector<Step> merge_rounds(const std::vector<Step>& steps);

// Lanes of a group's members (lanes[j]: member j's steps, every message's peer a member) placed in
// rounds: the result's lane j has member j's steps in order, with empty steps between, so that a
// message's send and its receive (the k-th send from one member to another meets the k-th receive
// there) sit at the same index, and every lane has the same length. A step goes one round after
// its rank's step before and after the other end of each of its messages (the longest path), so
// the rounds add no wait the lanes did not have. Zipping such lanes of disjoint groups (zip_steps)
// then keeps every message's two ends in one step: no rank of one group can wait on a rank that
// waits on it through another group. std::logic_error when the lanes cannot meet (a send without
// its receive, or a cycle: lanes that would deadlock).
std::vector<std::vector<Step>> align_rounds(const std::vector<int>& members, const std::vector<std::vector<Step>>& lanes);

}  // namespace sched
}  // namespace commlib
