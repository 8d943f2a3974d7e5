// reduce_scatter over buffers every peer has mapped (one-sided, one_sided.h's protocol), "mapped":
// rank r reads block r of every peer's input in place and reduces the blocks in rank order. Rank 0
// accumulates in its output; the others in scratch, copied out last: in place their output is
// their own input block, which the sum must not overwrite before it was added.
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
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out, own)}});
    return s;
  }
  Step ready;
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  const Region acc = r == 0 ? out : scratch_region(0, n);
  if (r != 0) s.scratch_count = n;
  append_ordered_get_reduce(s, r, P, acc, [&](int) { return in_region(r * n, n); });
  Step release;
  add_to_peers(release, r, P, op_wait, kTagDone);
  if (r != 0) release.ops.push_back(op_copy(out, acc));
  s.steps.push_back(std::move(release));
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "mapped", reduce_scatter_mapped, 50, kLargeMessages | kOneSided,
                           "one-sided: rank r reads block r of every peer's input in place, summed in rank order");

}  // namespace sched
}  // namespace commlib
