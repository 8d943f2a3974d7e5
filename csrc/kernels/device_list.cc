// The list the device paths run of a laned schedule (device_list.h).
#include "kernels/device_list.h"

#include <vector>

#include "schedule/subgroup.h"

namespace commlib {

namespace {

// Every lane's k-th step listed before any lane's (k+1)-th (interleave_rounds' order).
bool in_round_order(const Schedule& s, int lanes) {
  std::vector<int> done(static_cast<size_t>(lanes), 0);  // per lane: its steps so far
  int highest = 0;                                        // the highest round listed so far
  for (const Step& st : s.steps) {
    if (st.lane < 0 || st.lane >= lanes) return false;   // (the verifier rejects such a schedule)
    const int k = done[st.lane]++;
    if (k < highest) return false;  // a round listed after a later one
    highest = k;
  }
  return true;
}

}  // namespace

bool device_merges_rounds(const Schedule& sched, int lanes) {
  return lanes > 1 && (sched.window > 0 || in_round_order(sched, lanes));
}

Schedule device_list(const Schedule& sched, int lanes) {
  if (!device_merges_rounds(sched, lanes)) return sched;
  Schedule out;
  out.steps = sched::merge_rounds(sched.steps);
  out.scratch_count = sched.scratch_count;
  out.window = 0;
  return out;
}

}  // namespace commlib
