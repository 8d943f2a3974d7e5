// reduce to `root`:
//   binomial  tree in relative ranks (vr = rank - root mod P): vr receives-and-reduces its children
//             vr+1, vr+2, vr+4, ... (below its lowest set bit) in turn, then sends to vr - lowbit(vr).
//             Interior non-roots accumulate in scratch (they own no output); leaves send input.
//   direct    the root receives every input into scratch and reduces in rank order 0..P-1.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule reduce_binomial(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const int vr = pmod(r - a.root, P);
  Region acc = out_region(0, n);
  if (vr != 0) {
    acc = scratch_region(0, n);
    if (subtree_size(vr, P) > 1) s.scratch_count = n;
  }
  append_binomial_reduce(s, r, P, a.root, n, acc, vr == 0);
  return s;
}

Schedule reduce_direct(const CollArgs& a) {
  const int P = a.size, r = a.rank, root = a.root;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n);
  if (r != root) {
    s.steps.push_back(Step{{op_send(root, in)}});
    return s;
  }
  std::vector<Region> srcs(P);
  Step x;
  for (int j = 0; j < P; ++j) {
    if (j == r) {
      srcs[j] = in;
      continue;
    }
    srcs[j] = scratch_region((j < r ? j : j - 1) * n, n);
    x.ops.push_back(op_recv(j, srcs[j]));
  }
  if (!x.ops.empty()) s.steps.push_back(std::move(x));
  append_ordered_reduce(s, out_region(0, n), srcs, r);
  s.scratch_count = (P - 1) * n;
  return s;
}

COMMLIB_REGISTER_ALGORITHM(Reduce, "binomial", reduce_binomial, 1, kSmallMessages,
                           "binomial tree to the root");
COMMLIB_REGISTER_ALGORITHM(Reduce, "direct", reduce_direct, 2, kNoTraits,
                           "every rank sends to the root, which reduces in rank order");

}  // namespace sched
}  // namespace commlib
