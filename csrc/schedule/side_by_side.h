// Schedules side by side: two or more registered schedules of one all_reduce-shaped call (input and
// output one buffer of `count` elements) run concurrently on disjoint shares of the buffer, as one
// schedule the verifier proves, the simulator times and the executors run like any other. Each part
// is built by the registry for its share's count (build_schedule(args, composition)), its input and
// output regions moved to its share and its scratch past the parts before it, and each part in lanes
// of its own (schedule/lanes.h: a part of W lanes, the rail rings' channels, takes W; issue #39), so
// on the host executor a part's step waits only for its own lane's previous step: e.g. rail rings on
// one share keep the NICs busy while a pipelined hierarchical schedule's fill and drain keep the
// NVLink ports busy on the other (docs/simulator.md "Rails and hierarchical side by side"), and no
// part's step waits for the slowest of another's.
//
// The list order (what the device plans and compressed calls run, and what the verifier replays)
// is round by round (interleave_rounds) where every part is in lock step (every message's send and
// receive at the same index of its lane, as rings and hierarchical on equal hosts are): then every
// rank lists round k of every lane before any round k+1, each a whole exchange of its lane, which
// cannot deadlock. Parts that are not in lock step (a hierarchical schedule on unequal hosts folds
// and serves several groups) are listed one after another instead (lock_step false), which any valid
// parts allow; their lanes still overlap on the host.
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

// The parts of a's call (a.coll with one buffer shape: all_reduce, broadcast, reduce), each in lanes
// of its own (the first part's lanes first), listed round by round (lock_step) or one after another.
// Parts of count 0 are kept (their messages carry headers only), so the lanes are the same for every
// count: side_by_side_lanes.
Schedule side_by_side(const CollArgs& a, const std::vector<Part>& parts, bool lock_step);

// The lanes of side_by_side(a, parts, ...): the sum of the parts' (schedule_lanes, lanes.h).
int side_by_side_lanes(const CollArgs& a, const std::vector<Part>& parts);

// The parts as the lanes of one schedule (schedule/lanes.h): part c's steps, then part c+1's (W =
// parts.size(), parts of count 0 kept), each padded with empty steps to the longest part's length,
// so that lane c is the c-th W-th of the rank's steps (each step's Step::lane says so). Run in list
// order it is side_by_side's one after another (lock_step false).
Schedule lane_parts(const CollArgs& a, const std::vector<Part>& parts);

// Steps of lanes listed round by round: every step's round is its index among its lane's steps in
// its list; all lists' steps of round 0 first (list by list, each in its order), then round 1's, ...
// Each list's lanes must be its own (no lane in two lists). Empty steps are dropped.
std::vector<Step> interleave_rounds(std::vector<std::vector<Step>> lists);

}  // namespace sched
}  // namespace commlib
