// The intra-host lanes of the overlapped hierarchical pipeline, shared with its merge
// (hierarchical_overlap.cc): overlap_intra.cc builds them.
#pragma once

#include <cstdint>
#include <vector>

#include "schedule/hierarchical_layout.h"

namespace commlib {
namespace sched {

// Whether a step sends or receives (a message op).
bool step_talks(const Step& st);

// The elements a step moves through the busier direction of its rank (sent or received).
int64_t step_elements(const Step& st);

// This rank's intra lane of tick t (the all-gather of segment t-1, then the reduce-scatter of
// segment t+1, each in `chunks` pieces), aligned in rounds with its local peers' (align_rounds);
// `talks[k]`: some local rank sends or receives in round k; raises `scratch_end` to cover the lane.
// With `round_elements`, each talking round's weight for merge_by_elements (the most elements any
// local rank sends or receives in it). A host's lanes of a tick are built once per thread for all
// its local ranks (a memo; set_overlap_memo).
std::vector<Step> aligned_intra(const CollArgs& a, const Layout& y, int t, int chunks, int64_t base,
                                int64_t& scratch_end, std::vector<bool>& talks, const OverlapShape& shape,
                                std::vector<int64_t>* round_elements = nullptr);

}  // namespace sched
}  // namespace commlib
