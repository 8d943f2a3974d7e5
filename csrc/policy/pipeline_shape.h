// How finely a pipelined hierarchical all_reduce is cut, chosen from the cost model (docs/simulator.md
// "Pipelined hierarchical all_reduce: what bounds it"): its number of segments K (Composition::segment)
// and the most pieces the lane with fewer talking steps is cut into per segment
// (Composition::pieces, schedule/hierarchical_overlap.cc). More segments and pieces overlap more of
// the intra- and inter-host phases, and pay every message's latency and per-message costs more
// often; which wins depends on the links, so it is the model's to say, not a fixed rule's.
//
// The estimate is analytic, not the event run: one rank's schedule (rank 0 and the last rank, the
// larger) replayed step by step in lock step with its peers, under the simulator's own rules
// (sim/simulator.h): per-message and per-op overheads, the sender's and receiver's CPUs taking their
// messages one after another, each of the rank's links (its port or NIC, each direction) serving
// its bytes first come first served, a NIC's message gap, latency, a reducing receive's last chunk,
// then the step's copies and reductions. On equal hosts every rank's schedule has the same shape,
// so a peer's side of a message looks like the rank's own. Milliseconds at thousands of ranks; the
// policy never plays the full simulator to choose the shape (the candidate search then plays the
// chosen one).
#pragma once

#include <cstdint>
#include <vector>

#include "policy/auto_policy.h"

namespace commlib {

namespace sim {
struct Topology;
}

// The estimate above of `cand` (schedule/ir.h's Composition, any algorithm) in seconds, on a placed
// model (candidate_search.h, placed_model).
double pipeline_estimate(const CallShape& call, const Composition& cand, const sim::Topology& placed);

// `cand` with its segment and pieces chosen: for a hierarchical all_reduce across two hosts or more,
// the (K, pieces) of the smallest estimate among K in {1, 2, 4, 8, 16} (K = 1: not pipelined, so the
// choice is never estimated slower than the plain schedule) and pieces in {1, 2, 4, 8}; ties go to
// fewer segments, then fewer pieces. Anything else is returned as it is, and so is every candidate
// when COMMLIB_HIER_SEGMENT is set (the user's segment overrides the model's, as COMMLIB_ALGO_*
// overrides its algorithm). `estimate_s` (if not null): the chosen shape's estimate, else -1.
Composition choose_pipeline_shape(const CallShape& call, const Composition& cand, const sim::Topology& placed,
                                  double* estimate_s = nullptr);

// Whether choose_pipeline_shape chooses `cand`'s shape by simulating its shapes (rail_lanes across
// hosts without COMMLIB_HIER_SEGMENT: its lanes overlap, which the one-rank estimate cannot see)
// rather than by the analytic estimate.
bool shape_is_simulated(const CallShape& call, const Composition& cand, const sim::Topology& placed);

// The shapes choose_pipeline_shape simulates for such a candidate, in the order it tries them.
std::vector<Composition> simulated_shapes(const CallShape& call, const Composition& cand, const sim::Topology& placed);

// choose_pipeline_shape's choice for such a candidate when only a time at or under `beat_s` matters
// (the candidate search's best so far): a shape whose lower bound (`bounds`, one per
// simulated_shapes entry; empty: none known) exceeds the best so far or beat_s is not simulated, and
// every run stops past them. False when no shape finishes within beat_s; else true with the shape
// and simulated time choose_pipeline_shape gives (the shapes left out could not have been its
// choice). `runs`, `cut` (if not null): the shapes simulated and, of those, the ones stopped early.
// Memoised with choose_pipeline_shape's choices (a "none within beat_s" answers smaller beat_s too).
bool choose_simulated_shape(const CallShape& call, const Composition& cand, const sim::Topology& placed,
                            double beat_s, const std::vector<double>& bounds, Composition* shape, double* time_s,
                            int* runs = nullptr, int* cut = nullptr);

// choose_pipeline_shape keeps its choices per (call, candidate, placed model); this drops them
// (clear_candidate_cache calls it).
void clear_pipeline_shapes();

}  // namespace commlib
