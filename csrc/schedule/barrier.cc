// barrier (zero-count messages; each carries a header, which is what synchronises):
//   dissemination  ceil(log2 P) rounds; in round k rank r signals r + 2^k and waits for r - 2^k.
//   linear         everyone signals rank 0, which then releases everyone.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule barrier_dissemination(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  Schedule s;
  const Region none = scratch_region(0, 0);
  for (int d = 1; d < P; d <<= 1)
    s.steps.push_back(Step{{op_send((r + d) % P, none), op_recv(pmod(r - d, P), none)}});
  return s;
}

Schedule barrier_linear(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  Schedule s;
  const Region none = scratch_region(0, 0);
  if (P == 1) return s;
  if (r != 0) {
    s.steps.push_back(Step{{op_send(0, none)}});
    s.steps.push_back(Step{{op_recv(0, none)}});
    return s;
  }
  Step in, out;
  for (int j = 1; j < P; ++j) {
    in.ops.push_back(op_recv(j, none));
    out.ops.push_back(op_send(j, none));
  }
  s.steps.push_back(std::move(in));
  s.steps.push_back(std::move(out));
  return s;
}

COMMLIB_REGISTER_ALGORITHM(Barrier, "dissemination", barrier_dissemination, 1, kSmallMessages,
                           "ceil(log2 P) rounds of zero-byte messages");
COMMLIB_REGISTER_ALGORITHM(Barrier, "linear", barrier_linear, 2, kNoTraits,
                           "everyone to rank 0 and back");

}  // namespace sched
}  // namespace commlib
