// Lanes: slices in flight across steps (docs/DESIGN.md, "Lanes"). A schedule of W lanes is W step
// sequences one after another: a rank with n steps (W divides n) has lane c in its steps
// [c n/W, (c+1) n/W). Each lane's steps run in their order, but a lane's step waits only for its own
// lane's previous step, not for the other lanes' (NCCL's slices and channels: while one lane waits
// for a message's latency or its last small steps, another moves its large ones). The same list is
// also a plain schedule: run in list order, lane after lane, it is correct too (the host executor
// and the device plans run it so: one order the lanes allow, without their overlap).
//
// What makes the lanes independent, proven by the verifier (verify/verifier_lanes.h) besides the
// list order's results: W divides every rank's steps, every message's send and receive are in the
// same lane (a pair's messages then match first in, first out within each lane, as in list order),
// and on every rank no op of one lane writes an element an op of another lane reads or writes (in
// both buffer layouts). The simulator plays each (rank, lane) as its own sequence of steps on the
// rank's links and CPU (sim/run.h). The count W is a pure function of the call's arguments (never
// of the rank), given by the algorithm that registers it here; every other algorithm has one lane.
#pragma once

#include <string>

#include "schedule/ir.h"

namespace commlib {

using LaneCount = int (*)(const CollArgs&);

// The lanes of the registered `algorithm`'s schedule for `a` (1 unless it registered a count).
int schedule_lanes(const CollArgs& a, const std::string& algorithm);

// Registers an algorithm's lane count at load time (static initialisation of its file).
struct LanesRegistrar {
  LanesRegistrar(Collective c, const char* algorithm, LaneCount count);
};

}  // namespace commlib
