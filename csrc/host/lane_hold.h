// A test seam: hold this process's sends of one schedule lane in laned calls (executor_lanes.cc)
// while a file exists, so a test sees the other lanes go on meanwhile (the overlap the lanes give,
// tests/host/test_laned_calls.py) without hoping a timing race shows it. Unlike the single-copy
// read gate (read_gate.h) it blocks nothing: the executor only leaves those sends unmoved. Unarmed,
// the executor pays one relaxed atomic load per send it moves in a laned call.
#pragma once

#include <string>

namespace commlib {

// Arms the hold: sends of lane `lane` in laned calls wait while the file `path` exists (at most
// `max_wait_s` seconds from the first held send, then they go), then it disarms. Path '' disarms.
void arm_lane_hold(int lane, const std::string& path, double max_wait_s);

// Whether a send of `lane` waits now (false at once unless armed for that lane).
bool lane_held(int lane);

// A second seam: laned calls park every chunk that comes before its step runs at once (their
// fallback when a pass moved nothing, taken always), so tests meet the parked paths (a single-copy
// message read when parked) every time instead of when timing has it.
void set_park_eagerly(bool on);
bool park_eagerly();

}  // namespace commlib
