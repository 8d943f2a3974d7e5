// all_gather over buffers every peer has mapped (one-sided, one_sided.h's protocol), "mapped":
// after every peer's kTagReady, rank r reads each peer's input straight into its output block
// (one step, all peers at once), tells each peer it is done, and returns once every peer told it
// the same. In place a peer's input is its own output block, read there.
#include "schedule/one_sided.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

Schedule all_gather_mapped(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  Step ready;
  ready.ops.push_back(op_copy(out_region(r * n, n), in_region(0, n)));
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  if (P == 1) return s;
  Step gather;
  add_to_peers(gather, r, P, op_wait, kTagReady);
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    gather.ops.push_back(op_get(q, out_region(q * n, n), in_region(0, n)));
    gather.ops.push_back(op_signal(q, kTagDone));
  }
  s.steps.push_back(std::move(gather));
  Step release;
  add_to_peers(release, r, P, op_wait, kTagDone);
  s.steps.push_back(std::move(release));
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllGather, "mapped", all_gather_mapped, 50, kLargeMessages | kOneSided,
                           "one-sided: every rank reads each peer's input in place into its output");

}  // namespace sched
}  // namespace commlib
