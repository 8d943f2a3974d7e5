// all_to_all over buffers every peer has mapped (one-sided, one_sided.h's protocol), "mapped":
// after every peer's kTagReady, rank r reads block r of each peer's input into output block q (one
// step, all peers at once), tells each peer it is done, and returns once every peer told it the same.
#include "schedule/one_sided.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

Schedule all_to_all_mapped(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  Step ready;
  ready.ops.push_back(op_copy(out_region(r * n, n), in_region(r * n, n)));
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  if (P == 1) return s;
  Step exchange;
  add_to_peers(exchange, r, P, op_wait, kTagReady);
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    exchange.ops.push_back(op_get(q, out_region(q * n, n), in_region(r * n, n)));
    exchange.ops.push_back(op_signal(q, kTagDone));
  }
  s.steps.push_back(std::move(exchange));
  Step release;
  add_to_peers(release, r, P, op_wait, kTagDone);
  s.steps.push_back(std::move(release));
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllToAll, "mapped", all_to_all_mapped, 50, kLargeMessages | kOneSided,
                           "one-sided: every rank reads its block of each peer's input in place");

}  // namespace sched
}  // namespace commlib
