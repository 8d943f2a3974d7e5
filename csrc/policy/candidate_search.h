// auto's search for the fastest candidate under the cost model, fast at thousands of ranks
// (policy/auto_policy.h, resolve_algorithm step 3). Simulating every candidate in full costs
// minutes at 4096 ranks (a flat ring is 33 M steps), so the search is a branch and bound that gives
// exactly the answer of simulating them all:
//   * a lower bound per candidate from a few ranks' schedules alone (cheap: one rank's schedule,
//     not all P): a rank's steps run one after another and each lasts at least its slowest
//     transfer's latency + bytes / the fastest rate its link ever has (+ a reducing receive's last
//     chunk reduced), then its copies and reductions at the fastest rates, so their sum bounds the
//     collective's time from below;
//   * candidates are simulated in increasing bound order, the cheap ones (fewer than kCostlyOps
//     communication ops in all) before the costly ones; one whose bound is above the best time so
//     far is never built, and the others' event runs stop as soon as simulated time passes it
//     (sim::Options::stop_after_s);
//   * a pipelined hierarchical all_reduce with many segments and many messages in all (at 4096
//     ranks, 1 GiB, two_shot between 512 owners: 68 M transfers, a minute to build and run) is
//     not simulated whole at first: its first 3 and 4 segments are (same segment length), and its
//     time extrapolated from the steady state, T(4) + (K - 4)(T(4) - T(3)) (within 1 % of the
//     full run on dgx-h100 up to 1024 ranks for the built-in pipeline, bench/RESULTS_sim.md (f);
//     2-3 segments are not enough for the overlapped one, docs/simulator.md). Only such candidates
//     whose estimate comes within kExtrapolationMargin of the best are then simulated whole; a
//     lone one is taken at its estimate. Candidates whose predictions differ by less than the
//     margin are thus still told apart exactly, the others by an estimate far off from them;
//   * the result is kept per (call shape, host map, model, segment) for the process, so the
//     engines, the verifier and sub-communicators on the same placement share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/auto_policy.h"

namespace commlib {

namespace sim {
struct Topology;
}

// Every candidate of step 3 (a Composition, schedule/ir.h; the hierarchical ones with `segment`,
// the others with none), in registry order, where some host holds several ranks and ranks span
// hosts: the flat ones; hierarchical built-in; hierarchical with each flat algorithm across hosts;
// then each of those with each intra-host algorithm (intra_candidates) inside the hosts. So at most
// F + 1 + F (1 + I) candidates: all_reduce 7 + 1 + 7 x 2 = 22, all_gather 21, reduce_scatter 13,
// broadcast 21 with the built-in registry. all_reduce on hosts of equal size adds rail_split beside
// each hierarchical composition for calls of kSplitMinBytes or more (`bytes` < 0: unknown, added).
// rail_halving where hierarchical is, and rail_lanes and rail_window on equal power-of-two hosts,
// follow (rail_window from 4096 ranks only below kWindowHugeMaxBytes).
constexpr int64_t kWindowHugeMaxBytes = int64_t{512} << 20;
std::vector<Composition> candidate_list(Collective c, const std::vector<int>& host_of, int64_t segment,
                                        int64_t bytes = -1);

// rail_lanes is ranked from this many bytes a call: below it every lane's steps are latency-bound
// (2 and 16 dgx-h100 nodes, 256 KiB: 0.67 and 0.69 of the best's busbw; from 1 MiB it can win).
constexpr int64_t kLanesMinBytes = int64_t{1} << 20;

// rail_split (schedule/side_by_side.h) is ranked from this many bytes a call: it balances the NICs'
// and the ports' bytes, while its rail rings keep every one of their 2(P-1) lock-step steps, whose
// fixed costs outweigh that below (docs/simulator.md "Rails and hierarchical side by side").
constexpr int64_t kSplitMinBytes = int64_t{16} << 20;

// The intra-host algorithms auto tries for c's hierarchical schedule (CollArgs::intra_algorithm):
// the built-ins registered for the intra phases' collective (all_reduce: for both reduce_scatter and
// all_gather), less "direct" (the built-in intra phases are direct exchanges already).
std::vector<std::string> intra_candidates(Collective c);

// The model placed on this host map (hosts renumbered densely, NICs by local index).
sim::Topology placed_model(const sim::Topology& model, const std::vector<int>& host_of);

// The lower bound above, in seconds, for one candidate on a placed model.
// ops_per_rank (if not null): the most communication ops of the ranks it built.
double candidate_lower_bound(const CallShape& call, const Composition& cand, const sim::Topology& placed,
                             int64_t* ops_per_rank = nullptr);

// A candidate is extrapolated (above) when it has this many communication ops in all (ranks x
// the most of one rank) or more, and 5 pipeline segments or more. 0: never.
constexpr int64_t kExtrapolateOps = 2'000'000;
// A candidate with this many communication ops in all (ranks x the most of one rank) is simulated
// after every cheaper one (at 4096 ranks, 1 GiB reduce_scatter: a flat ring or the built-in
// intra-host rounds, 15-33 M transfers, behind a hierarchical one with registered algorithms in
// both phases, 0.1-2 M). 0: bound order alone.
constexpr int64_t kCostlyOps = 1'000'000;
// How close (relative) an extrapolated candidate must come to the best to be simulated whole.
constexpr double kExtrapolationMargin = 0.03;

struct SearchStats {
  int candidates = 0;
  int simulated = 0;  // built and run (to the end or cut)
  int cut = 0;        // of those, stopped once they could not win
  int extrapolated = 0;  // estimated from their first segments (of those, simulated whole: confirmed)
  int confirmed = 0;
  bool cached = false;
};

// The candidate with the smallest predicted time (ties within policy/tie_rule.h: the earlier in candidate_list order), the
// same as the minimum over predict_candidates where no extrapolated candidate is within the margin
// of another. hier_only: among the hierarchical candidates only. extrapolate_ops: kExtrapolateOps,
// lower in tests (0: simulate every candidate whole, the exact search).
AlgorithmChoice search_best_candidate(const CallShape& call, const std::vector<int>& host_of,
                                      const sim::Topology& model, bool hier_only, SearchStats* stats = nullptr,
                                      int64_t extrapolate_ops = kExtrapolateOps, int64_t costly_ops = kCostlyOps);

// Drops the process-wide cache (tests).
void clear_candidate_cache();

}  // namespace commlib
