// Pieces shared by the one-sided builders (ir.h "One-sided operations"; trait kOneSided). Every
// one-sided schedule here follows one protocol, so its hazards are easy to see:
//   kTagReady   step 0: "my buffers are in the call": no peer touches them before it (the
//               previous kernel on my stream may still have been writing them);
//   kTagResult  two-shot: "my reduced block is complete", which also says I finished reading your
//               input (I read it before reducing);
//   kTagDone    "I finished reading your buffers": the last step waits for it from every peer, so
//               a rank returns (and its caller reuses the buffers) only once nobody reads them.
// Every element's reduction has one fixed order, so every rank ends with identical bits and a rerun
// repeats them: the one-shot (every rank reduces everything) sums in rank order 0, 1, ..., P-1; the
// reduce-scatter and the two-shot (block b is reduced by rank b alone, then copied) sum block b in
// the order b, b+1, ..., b-1, so that in each step every rank reads a different peer.
#pragma once


#include "schedule/builders.h"

namespace commlib {
namespace sched {

enum OneSidedTag : int { kTagReady = 0, kTagResult = 1, kTagDone = 2 };

// One op of `kind` (op_signal or op_wait) with `tag` to every peer of rank r, appended to `st`.
inline void add_to_peers(Step& st, int r, int P, Op (*make)(int, int), int tag) {
  for (int q = 0; q < P; ++q)
    if (q != r) st.ops.push_back(make(q, tag));
}

// Appends the steps acc = src(r) op src(r+1) op ... op src(r-1) (ranks mod P), one step each:
// src(j) is `region` of rank j's buffers, read in place (this rank's own: a local copy first). The
// first get's step also waits for every peer's kTagReady; with release_tag >= 0 the step reading
// peer j signals it release_tag. `acc` must be a region nobody else touches while it accumulates.
void append_rotated_get_reduce(Schedule& s, int r, int P, Region acc, Region region, int release_tag);

// The fused shape (reduce_to_all, reduce_from_all: one op reads every rank at once): a step
// signalling kTagReady to every peer; a step waiting for every peer's kTagReady, running `fused`
// and signalling `done_tag` to every peer; a step waiting for every peer's `done_tag` (nobody
// touches this rank's buffers any more once it ends).
void append_fused(Schedule& s, int r, int P, Op fused, int done_tag);

}  // namespace sched
}  // namespace commlib
