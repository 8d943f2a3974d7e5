// Pieces shared by the one-sided builders (ir.h "One-sided operations"; trait kOneSided). Every
// one-sided schedule here follows one protocol, so its hazards are easy to see:
//   kTagReady   step 0: "my buffers are in the call": no peer touches them before it (the
//               previous kernel on my stream may still have been writing them);
//   kTagResult  two-shot: "my reduced block (scratch) is complete", which also says I finished
//               reading your input (I read it before reducing);
//   kTagDone    "I finished reading your buffers": the last step waits for it from every peer, so
//               a rank returns (and its caller reuses the buffers) only once nobody reads them.
// Reductions run in rank order 0, 1, ..., P-1 (left to right), so every rank that computes an
// element computes the same bits.
#pragma once

#include <functional>

#include "schedule/builders.h"

namespace commlib {
namespace sched {

enum OneSidedTag : int { kTagReady = 0, kTagResult = 1, kTagDone = 2 };

// One op of `kind` (op_signal or op_wait) with `tag` to every peer of rank r, appended to `st`.
inline void add_to_peers(Step& st, int r, int P, Op (*make)(int, int), int tag) {
  for (int q = 0; q < P; ++q)
    if (q != r) st.ops.push_back(make(q, tag));
}

// Appends the steps acc = src(0) op src(1) op ... op src(P-1): src(j) is region(j) of rank j's
// buffers (read in place; this rank's own is a local read). The first step also waits for every
// peer's kTagReady; the step reading peer j signals it kTagDone (released: nothing reads j again).
// `acc` must be a region nobody else reads while it accumulates.
void append_ordered_get_reduce(Schedule& s, int r, int P, Region acc, const std::function<Region(int)>& region);

}  // namespace sched
}  // namespace commlib
