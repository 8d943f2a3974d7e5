// Lanes: slices in flight across steps (docs/DESIGN.md, "Lanes"). A schedule of W lanes gives each
// step its lane (ir.h Step::lane, 0..W-1). Each lane's steps run in their order, but a step waits
// only for its own lane's previous step, not for the other lanes' (NCCL's slices and channels: while
// one lane waits for a message's latency or its last small steps, another moves its large ones), and
// for the schedule's window (ir.h Schedule::window: with D > 0 steps start in list order and step i
// once step i - D has finished: at most D steps in flight, NCCL_STEPS). rail_lanes lists its lanes one
// after another (lane c the c-th W-th of the steps) with no window; rail_window interleaves one lane
// per segment in pipelined order under a window. The same list is also a plain schedule: run in list
// order it is correct too (the device plans and compressed host calls run it so: one order the lanes
// allow, without their overlap; the host executor runs the lanes in flight, host/executor_lanes.cc).
//
// What makes the lanes independent, proven by the verifier (verify/verifier_lanes.h) besides the
// list order's results: every step's lane is among the W, every rank has the same window, every
// message's send and receive are in the same lane (a pair's messages then match first in, first out
// within each lane, as in list order), and on every rank no op of one lane writes an element an op of
// another lane reads or writes (in both buffer layouts); a window only holds steps back, so it adds
// nothing to prove. The simulator plays each (rank, lane) as its own sequence of steps on the rank's
// links and CPU, gated by the window (sim/run.h). The count W is a pure function of the call's
// arguments (never of the rank), given by the algorithm that registers it here; every other
// algorithm has one lane, and a schedule of one lane runs in list order whatever its steps' lane
// fields say (a Python algorithm returning a laned schedule's dicts plays it so).
#pragma once

#include <string>
#include <vector>

#include "schedule/ir.h"

namespace commlib {

using LaneCount = int (*)(const CollArgs&);

// The lanes of the registered `algorithm`'s schedule for `a` (1 unless it registered a count).
int schedule_lanes(const CollArgs& a, const std::string& algorithm);

// Schedule::intra_window's gates for rank `rank`'s schedule `s` (host_of: every rank's host, empty:
// one host), into `gate`: per step, the step it also waits for (the intra_window-th step listed
// before it whose messages all stay inside the host, if it is one such itself), -1 none; empty
// where the schedule has no intra window. The simulator (sim/compact.cc) and the host executor
// (host/lowering.cc) both gate by it.
void intra_window_gates(const Schedule& s, int rank, const std::vector<int>& host_of, std::vector<int>& gate);

// Registers an algorithm's lane count at load time (static initialisation of its file).
struct LanesRegistrar {
  LanesRegistrar(Collective c, const char* algorithm, LaneCount count);
};

}  // namespace commlib
