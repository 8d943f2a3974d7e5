// rail_window's shapes for the cost model's choice (policy/pipeline_shape.h: simulated_shapes hands
// a rail_window candidate these; schedule/rail_window.cc is the schedule).
#pragma once

#include <vector>

#include "policy/auto_policy.h"
#include "schedule/ir.h"
#include "sim/topology.h"

namespace commlib {

// The segments (K) and windows (D) auto simulates for `cand` (rail_window) on the placed model, in
// the order it tries them: K 128 with a window of two segments' steps, its end segments ramped (R 2)
// and each segment's intra-host phases direct (session 29); then, the ring inside the hosts, K 64
// and 128 with a window of one segment's steps, K 128 with two, K 32; from 4096 ranks K 64 only,
// the ring inside, its end segments ramped (R 2). Shapes whose segments would hold fewer
// than 2 elements a rank (the builder's one-lane fallback) are left out.
std::vector<Composition> window_shapes(const CallShape& call, const Composition& cand, const sim::Topology& placed);

}  // namespace commlib
