// Helpers shared by several builders (builders.h).
#include "schedule/builders.h"

namespace commlib {
namespace sched {

void append_ordered_reduce(Schedule& s, Region dst, const std::vector<Region>& srcs, int own) {
  const int P = static_cast<int>(srcs.size());
  if (own == 0) {
    // dst may alias srcs[0] (the input): copy is then a no-op; later srcs are scratch.
    s.steps.push_back(Step{{op_copy(dst, srcs[0])}});
    for (int i = 1; i < P; ++i) s.steps.push_back(Step{{op_reduce(dst, srcs[i])}});
    return;
  }
  // dst may alias the input srcs[own]: accumulate in srcs[0] (scratch) and copy out last.
  for (int i = 1; i < P; ++i) s.steps.push_back(Step{{op_reduce(srcs[0], srcs[i])}});
  s.steps.push_back(Step{{op_copy(dst, srcs[0])}});
}

void append_binomial_reduce(Schedule& s, int rank, int size, int root, int64_t count, Region acc,
                            bool acc_is_output) {
  // acc: where this rank accumulates its subtree (root: output; others: output if they own it,
  // else scratch). Leaves send their input directly.
  const int P = size, vr = pmod(rank - root, P);
  const Region in = in_region(0, count);
  const int sub = subtree_size(vr, P);
  const bool leaf = sub == 1;
  (void)acc_is_output;
  if (!leaf || vr == 0) s.steps.push_back(Step{{op_copy(acc, in)}});
  for (int mask = 1; mask < sub; mask <<= 1) {
    const int child = vr + mask;
    if (child >= P) break;
    s.steps.push_back(Step{{op_recv_reduce(pmod(child + root, P), acc)}});
  }
  if (vr != 0) {
    const int parent = pmod(vr - lowbit(vr) + root, P);
    s.steps.push_back(Step{{op_send(parent, leaf ? in : acc)}});
  }
}

void append_binomial_bcast(Schedule& s, int rank, int size, int root, Region src, Region buf) {
  const int P = size, vr = pmod(rank - root, P);
  if (vr != 0) {
    const int parent = pmod(vr - lowbit(vr) + root, P);
    s.steps.push_back(Step{{op_recv(parent, buf)}});
  }
  const Region from = vr == 0 ? src : buf;
  // Children: vr + mask for masks below lowbit(vr) (all masks for the root), largest first so the
  // deepest subtree starts earliest.
  const int top = vr == 0 ? pow2_floor(P > 1 ? 2 * P - 1 : 1) : lowbit(vr);
  for (int mask = top >> 1; mask >= 1; mask >>= 1) {
    const int child = vr + mask;
    if (child >= P) continue;
    s.steps.push_back(Step{{op_send(pmod(child + root, P), from)}});
  }
}

}  // namespace sched
}  // namespace commlib
