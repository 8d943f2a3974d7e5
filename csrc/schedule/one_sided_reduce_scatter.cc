// reduce_scatter over buffers every peer has mapped (one-sided, one_sided.h's protocol):
//   mapped        rank r reads block r of every peer's input in place, one peer per step (the order
//                 r, r+1, ..., so every step's reads go to distinct peers), and reduces it into its
//                 output: (2P - 1) / P x N read and N written per rank (N: the input's bytes), the
//                 output a memory accumulator. In place the output is its own input block r, which
//                 only it reads.
//   mapped_fused  once every peer is in the call, rank r reads block r of every rank's input once,
//                 reduces it in rank order 0..P-1 (in registers on the kernel path) and stores the
//                 result into its output once (reduce_from_all): N read and N / P written per rank.
//                 Its kTagDone says "I finished reading your block r"; a rank returns once every
//                 peer's came (nobody reads its input any more).
#include "schedule/one_sided.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

Schedule reduce_scatter_mapped(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region out = out_region(0, n), own = in_region(r * n, n);
  if (P == 1) return single_rank_copy(out, own);
  Step ready;
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  append_rotated_get_reduce(s, r, P, out, own, kTagDone);
  Step release;
  add_to_peers(release, r, P, op_wait, kTagDone);
  s.steps.push_back(std::move(release));
  return s;
}

Schedule reduce_scatter_mapped_fused(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region out = out_region(0, n), own = in_region(r * n, n);
  if (P == 1) return single_rank_copy(out, own);
  // In place the output is input block r, which no peer writes: every element is read from every
  // rank before it is stored (the kernel's thread loads it everywhere first). kTagDone: "I finished
  // reading your block r".
  append_fused(s, r, P, op_reduce_from_all(out, own), kTagDone);
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "mapped", reduce_scatter_mapped, 50, kLargeMessages | kOneSided,
                           "one-sided: rank r reads block r of every peer's input in place, one peer per step");
COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "mapped_fused", reduce_scatter_mapped_fused, 50, kLargeMessages | kOneSided,
                           "one-sided: rank r reads block r of every rank's input once, reduced in rank order in "
                           "registers, stored once into its output");

}  // namespace sched
}  // namespace commlib
