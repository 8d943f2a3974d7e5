// The lanes of a schedule proven independent (schedule/lanes.h), before the replay proves its
// results in list order: every message's send and receive in the same lane, and on every rank no op
// of one lane writing an element another lane's op reads or writes (both buffer layouts where the
// collective has an in-place one). Together they make every interleaving the lanes allow compute what
// list order computes: each lane reads only what its own steps (and its own peers' lanes) wrote.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schedule/ir.h"

namespace commlib {

// Throws VerificationError naming the rank, step and op; std::invalid_argument for lanes < 1.
// lanes == 1 checks nothing.
void check_lanes(Collective c, const std::vector<Schedule>& per_rank, int size, int64_t count, int root, int lanes,
                 const std::string& label);

}  // namespace commlib
