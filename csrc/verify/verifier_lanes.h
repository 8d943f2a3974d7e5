// The lanes of a schedule proven independent (schedule/lanes.h, each step's `Step::lane`), before the
// replay proves its results in list order: every step's lane among the schedule's W, one window for
// every rank, every message's send and receive in the same lane, and on every rank no op
// of one lane writing an element another lane's op reads or writes (both buffer layouts where the
// collective has an in-place one). Together they make every interleaving the lanes allow compute what
// list order computes: each lane reads only what its own steps (and its own peers' lanes) wrote. A
// window (Schedule::window) only orders steps further, so whatever steps it lets be in flight
// together are of different lanes, which touch no common element that either writes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schedule/ir.h"

namespace commlib {

// Throws VerificationError naming the rank, step and op; std::invalid_argument for lanes < 1.
// lanes == 1 checks nothing: a schedule of one lane runs in list order (its steps' lane fields and
// window unread, as everywhere: schedule/lanes.h).
void check_lanes(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count, int root, int lanes,
                 const std::string& label);

// Schedules from outside that give no step its lane (_verify_custom's `lanes` without step_lanes):
// lane c is the c-th lanes-th of every rank's steps (lanes.h's first form); VerificationError when
// `lanes` does not divide a rank's steps.
void assign_contiguous_lanes(std::vector<Schedule>& per_rank, int lanes, const std::string& label);

}  // namespace commlib
