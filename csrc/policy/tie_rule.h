// auto's one rule for predictions that tie (docs/simulator.md "Ties in auto's ranking"). The model's
// times are sums of many terms whose last bits depend on how the call is counted (session 27: 3
// ranks on 2 dgx-h100 hosts, all_gather of 70001 x float32 against the same bytes as 280004 x
// 1-byte elements: direct and rail_ring 1.2446556701030928e-05 s and ...93e-05 s, ordered by
// rounding). So two predictions within kTieRelative of each other are a tie, and a tie goes to
// the candidate earlier in a fixed preference order: the candidates' candidate_list order
// (policy/candidate_search.h: flat algorithms in registry order, then hierarchical and its
// compositions, rail_split, rail_halving, rail_lanes, rail_window), a candidate's shapes in their
// list's order (pipeline_shape.cc). The one pick of a set of times is `tie_pick`: the first time
// within the tie of the smallest. Every choice by predicted time goes through it (the search, the
// full ranking, the shapes, the device plans' model choice), so they agree wherever their times
// agree to within the tie; the branch and bound keeps every candidate that may tie (bounds and
// stopped runs compare with tie_limit of the best so far, not the best).
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace commlib {

// 1e-9: rounding of the model's sums moves a time by some 1e-15 relative (a few units in the last
// place), while the closest distinct predictions auto ranks differ by 1e-6 relative or more (the
// model's inputs have three or four significant digits; a nanosecond in a second is no choice).
constexpr double kTieRelative = 1e-9;

// The largest time that still ties with best_s (a time above it loses to best_s).
inline double tie_limit(double best_s) { return best_s * (1 + kTieRelative); }

// Of times listed in preference order, the index of the one picked: the first within the tie of the
// smallest. Infinite or not-a-number times are never picked; times.size() when none is finite.
inline size_t tie_pick(const std::vector<double>& times) {
  double least = INFINITY;
  for (double t : times)
    if (std::isfinite(t) && t < least) least = t;
  if (!std::isfinite(least)) return times.size();
  for (size_t i = 0; i < times.size(); ++i)
    if (std::isfinite(times[i]) && times[i] <= tie_limit(least)) return i;
  return times.size();
}

}  // namespace commlib
