// The shared one-sided reduction (one_sided.h).
#include "schedule/one_sided.h"

namespace commlib {
namespace sched {

void append_rotated_get_reduce(Schedule& s, int r, int P, Region acc, Region region, int release_tag) {
  s.steps.push_back(Step{{op_copy(acc, region)}});
  for (int k = 1; k < P; ++k) {
    const int j = (r + k) % P;
    Step st;
    if (k == 1) add_to_peers(st, r, P, op_wait, kTagReady);
    st.ops.push_back(op_get_reduce(j, acc, region));
    if (release_tag >= 0) st.ops.push_back(op_signal(j, release_tag));
    s.steps.push_back(std::move(st));
  }
}

void append_fused(Schedule& s, int r, int P, Op fused, int done_tag) {
  Step ready;
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  Step run;
  add_to_peers(run, r, P, op_wait, kTagReady);
  run.ops.push_back(std::move(fused));
  add_to_peers(run, r, P, op_signal, done_tag);
  s.steps.push_back(std::move(run));
  Step release;
  add_to_peers(release, r, P, op_wait, done_tag);
  s.steps.push_back(std::move(release));
}

}  // namespace sched
}  // namespace commlib
