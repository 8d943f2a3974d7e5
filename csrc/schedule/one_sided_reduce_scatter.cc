// reduce_scatter over buffers every peer has mapped (one-sided, one_sided.h's protocol), "mapped":
// rank r reads block r of every peer's input in place, one peer per step (the order r, r+1, ...,
// so every step's reads go to distinct peers), and reduces it into its output. In place the output
// is its own input block r, which only it reads.
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
  append_rotated_get_reduce(s, r, P, out, own, kTagDone);
  Step release;
  add_to_peers(release, r, P, op_wait, kTagDone);
  s.steps.push_back(std::move(release));
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "mapped", reduce_scatter_mapped, 50, kLargeMessages | kOneSided,
                           "one-sided: rank r reads block r of every peer's input in place, one peer per step");

}  // namespace sched
}  // namespace commlib
