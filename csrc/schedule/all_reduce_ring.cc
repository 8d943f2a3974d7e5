// all_reduce ring: reduce-scatter (P-1 steps) then all-gather (P-1 steps) around 0->1->..->P-1->0.
// Block b (blk_off/blk_len of P blocks) is reduced along the ring starting at rank b and ends fully
// reduced on rank b-1, which is the only rank that reduces its final value; the all-gather then
// copies those bits to everyone, so all ranks end bitwise identical.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule all_reduce_ring(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  s.steps.reserve(2 * P);
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
    return s;
  }
  auto blk = [&](BufferId buf, int b) {
    b = pmod(b, P);
    return Region{buf, blk_off(n, P, b), blk_len(n, P, b)};
  };
  auto out = [&](int b) { return blk(BufferId::Output, b); };
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  // No input->output copy out of place: the first step sends this rank's block from the input, and
  // every block reduced here is reduced straight from the input into the output (each block is
  // reduced once per rank in the reduce-scatter). Block r of the output is written by the
  // all-gather.
  for (int k = 0; k < P - 1; ++k)
    s.steps.push_back(Step{{op_send(next, k == 0 ? blk(BufferId::Input, r) : out(r - k)),
                            op_recv_reduce_from(prev, out(r - k - 1), blk(BufferId::Input, r - k - 1))}});
  for (int k = 0; k < P - 1; ++k)
    s.steps.push_back(Step{{op_send(next, out(r + 1 - k)), op_recv(prev, out(r - k))}});
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "ring", all_reduce_ring, 1, kLargeMessages,
                           "reduce-scatter then all-gather around a ring");

}  // namespace sched
}  // namespace commlib
