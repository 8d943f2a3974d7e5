// all_reduce tree: binomial-tree reduce to rank 0, then binomial-tree broadcast from rank 0.
// Only rank 0 computes the final value; the broadcast copies its bits to everyone.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule all_reduce_tree(const CollArgs& a) {
  const int64_t n = a.count;
  Schedule s;
  const Region out = out_region(0, n);
  append_binomial_reduce(s, a.rank, a.size, 0, n, out, true);
  append_binomial_bcast(s, a.rank, a.size, 0, out, out);
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "tree", all_reduce_tree, 6, kSmallMessages,
                           "binomial-tree reduce then binomial-tree broadcast");

}  // namespace sched
}  // namespace commlib
