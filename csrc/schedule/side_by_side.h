// Schedules side by side: two or more registered schedules of one all_reduce-shaped call (input and
// output one buffer of `count` elements) run concurrently on disjoint shares of the buffer, as one
// schedule the verifier proves, the simulator times and the executors run like any other. Each part
// is built by the registry for its share's count (build_schedule(args, composition)), its input and
// output regions moved to its share and its scratch past the parts before it, and the parts' steps
// merged (merge_lanes): step k holds step k of every part, so, e.g., rail rings on one share keep
// the NICs busy while a pipelined hierarchical schedule's fill and drain keep the NVLink ports busy on
// the other (docs/simulator.md "Rails and hierarchical side by side").
//
// Two parts may talk to the same peer in the same step (the rail ring's crossing and hierarchical's
// inter lane both talk to the same local index of the next host): the step then holds both messages,
// the earlier part's first, and a pair's messages in one step match in op order (ir.h). That is
// right when every part is in lock step (every message's send and receive at the same step index of
// its part, as rings and hierarchical on equal hosts are): then both ends of a pair list step k's
// messages in part order, so send order = receive order, and every message's two ends sit in the
// same merged step, which cannot deadlock. Parts that are not in lock step (a hierarchical schedule
// on unequal hosts folds and serves several groups) run one after another instead (lock_step
// false), which any valid parts allow.
#pragma once

#include <cstdint>
#include <vector>

#include "schedule/ir.h"

namespace commlib {
namespace sched {

// CollArgs::share's unit (the rail rings' share is share / kShareUnits of the buffer), and the share
// rail_split takes when none is given: the balance of the NICs and the NVLink ports on 2 dgx-h100
// nodes (docs/simulator.md), 0.84.
constexpr int kShareUnits = 1024;
constexpr int kDefaultShare = 860;

struct Part {
  Composition how;     // what runs on the share (its algorithm, and hierarchical's phases)
  int64_t offset = 0;  // the share's first element
  int64_t count = 0;   // its elements
};

// Elements [0, count * share / kShareUnits) of count, exactly (no overflow for any int64 count).
int64_t share_of(int64_t count, int share);

// The parts of a's call (a.coll with one buffer shape: all_reduce, broadcast, reduce) side by side
// (lock_step) or one after another. A part of count 0 is left out unless every part has count 0.
Schedule side_by_side(const CollArgs& a, const std::vector<Part>& parts, bool lock_step);

// The parts as the lanes of one schedule (schedule/lanes.h): part c's steps, then part c+1's (W =
// parts.size(), parts of count 0 kept), each padded with empty steps to the longest part's length,
// so that lane c is the c-th W-th of the rank's steps (each step's Step::lane says so). Run in list
// order it is side_by_side's one after another (lock_step false).
Schedule lane_parts(const CollArgs& a, const std::vector<Part>& parts);

// Lanes merged step by step (above): step k holds step k of every lane, lane 0's ops first, in
// their order. Empty steps are dropped.
std::vector<Step> merge_lanes(const std::vector<std::vector<Step>>& lanes);

}  // namespace sched
}  // namespace commlib
