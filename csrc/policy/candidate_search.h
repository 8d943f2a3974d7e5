// auto's search for the fastest candidate under the cost model, fast at thousands of ranks
// (policy/auto_policy.h, resolve_algorithm step 3). Simulating every candidate in full costs
// minutes at 4096 ranks (a flat ring is 33 M steps), so the search is a branch and bound that gives
// exactly the answer of simulating them all:
//   * a lower bound per candidate from a few ranks' schedules alone (cheap: one rank's schedule,
//     not all P): a rank's steps run one after another and each lasts at least its slowest
//     transfer's latency + bytes / the fastest rate its link ever has, so their sum bounds the
//     collective's time from below;
//   * candidates are simulated in increasing bound order; one whose bound is above the best time so
//     far is never built, and the others' event runs stop as soon as simulated time passes it
//     (sim::Options::stop_after_s);
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

// Every candidate of step 3 as (algorithm, inter_algorithm), in registry order, hierarchical ones
// (with each inter-host algorithm) after the flat ones, where some host holds several ranks.
std::vector<std::pair<std::string, std::string>> candidate_list(Collective c, const std::vector<int>& host_of);

// The model placed on this host map (hosts renumbered densely, NICs by local index).
sim::Topology placed_model(const sim::Topology& model, const std::vector<int>& host_of);

// The lower bound above, in seconds, for one candidate on a placed model.
double candidate_lower_bound(const CallShape& call, const std::string& algorithm, const std::string& inter,
                             int64_t segment, const sim::Topology& placed);

struct SearchStats {
  int candidates = 0;
  int simulated = 0;  // built and run (to the end or cut)
  int cut = 0;        // of those, stopped once they could not win
  bool cached = false;
};

// The candidate with the smallest predicted time (ties: the earlier in candidate_list order), the
// same as the minimum over predict_candidates. hier_only: among the hierarchical candidates only.
AlgorithmChoice search_best_candidate(const CallShape& call, const std::vector<int>& host_of,
                                      const sim::Topology& model, bool hier_only, SearchStats* stats = nullptr);

// Drops the process-wide cache (tests).
void clear_candidate_cache();

}  // namespace commlib
