// The shared one-sided reduction (one_sided.h).
#include "schedule/one_sided.h"

namespace commlib {
namespace sched {

void append_ordered_get_reduce(Schedule& s, int r, int P, Region acc, const std::function<Region(int)>& region) {
  for (int j = 0; j < P; ++j) {
    Step st;
    if (j == 0) add_to_peers(st, r, P, op_wait, kTagReady);
    if (j == r) {
      st.ops.push_back(j == 0 ? op_copy(acc, region(j)) : op_reduce(acc, region(j)));
    } else {
      st.ops.push_back(j == 0 ? op_get(j, acc, region(j)) : op_get_reduce(j, acc, region(j)));
      st.ops.push_back(op_signal(j, kTagDone));
    }
    s.steps.push_back(std::move(st));
  }
}

}  // namespace sched
}  // namespace commlib
