// all_reduce ring: reduce-scatter (P-1 steps) then all-gather (P-1 steps) around 0->1->..->P-1->0.
// Block b (blk_off/blk_len of P blocks) is reduced along the ring starting at rank b and ends fully
// reduced on rank b-1, which is the only rank that reduces its final value; the all-gather then
// copies those bits to everyone, so all ranks end bitwise identical.
#include "schedule/builders.h"

namespace commlib {
namespace sched {

Schedule all_reduce_ring(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  s.steps.reserve(2 * P);
  s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
  if (P == 1) return s;
  auto blk = [&](int b) {
    b = pmod(b, P);
    return out_region(blk_off(n, P, b), blk_len(n, P, b));
  };
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  for (int k = 0; k < P - 1; ++k)
    s.steps.push_back(Step{{op_send(next, blk(r - k)), op_recv_reduce(prev, blk(r - k - 1))}});
  for (int k = 0; k < P - 1; ++k)
    s.steps.push_back(Step{{op_send(next, blk(r + 1 - k)), op_recv(prev, blk(r - k))}});
  return s;
}

}  // namespace sched
}  // namespace commlib
