// The list the device paths run of a laned schedule (device_list.h).
#include "kernels/device_list.h"

#include <algorithm>
#include <vector>

#include "schedule/subgroup.h"

namespace commlib {

namespace {

// Every lane's k-th step listed before any lane's (k+1)-th (interleave_rounds' order), over the
// steps [begin, end).
bool in_round_order(const std::vector<Step>& steps, size_t begin, size_t end, int lanes) {
  std::vector<int> done(static_cast<size_t>(lanes), 0);  // per lane: its steps so far
  int highest = 0;                                        // the highest round listed so far
  for (size_t i = begin; i < end; ++i) {
    const int k = done[steps[i].lane]++;
    if (k < highest) return false;  // a round listed after a later one
    highest = k;
  }
  return true;
}

// The list's blocks: maximal runs of steps whose lanes' spans (first to last step of a lane)
// overlap; a lane lies in one block. Each block: [begin, end), and whether its rounds merge.
struct Block {
  size_t begin, end;
  bool merge;
};

std::vector<Block> blocks_of(const Schedule& s, int lanes) {
  std::vector<Block> out;
  if (lanes <= 1) return out;
  std::vector<size_t> last(static_cast<size_t>(lanes), 0);
  for (size_t i = 0; i < s.steps.size(); ++i) {
    if (s.steps[i].lane < 0 || s.steps[i].lane >= lanes) return {};  // (the verifier rejects such a schedule)
    last[s.steps[i].lane] = i;
  }
  for (size_t i = 0; i < s.steps.size();) {
    size_t end = last[s.steps[i].lane] + 1;
    std::vector<bool> seen(static_cast<size_t>(lanes), false);
    int in_block = 0;
    for (size_t j = i; j < end; ++j) {
      end = std::max(end, last[s.steps[j].lane] + 1);
      if (!seen[s.steps[j].lane]) ++in_block, seen[s.steps[j].lane] = true;
    }
    out.push_back(Block{i, end, in_block > 1 && (s.window > 0 || in_round_order(s.steps, i, end, lanes))});
    i = end;
  }
  return out;
}

}  // namespace

bool device_merges_rounds(const Schedule& sched, int lanes) {
  for (const Block& b : blocks_of(sched, lanes))
    if (b.merge) return true;
  return false;
}

Schedule device_list(const Schedule& sched, int lanes, std::vector<bool>* merged) {
  const std::vector<Block> blocks = blocks_of(sched, lanes);
  const bool any = std::any_of(blocks.begin(), blocks.end(), [](const Block& b) { return b.merge; });
  if (!any) {
    if (merged) merged->assign(sched.steps.size(), false);
    return sched;
  }
  Schedule out;
  out.scratch_count = sched.scratch_count;
  out.window = 0;
  if (merged) merged->clear();
  for (const Block& b : blocks) {
    std::vector<Step> part(sched.steps.begin() + b.begin, sched.steps.begin() + b.end);
    if (b.merge) {
      std::vector<int> per_round;  // steps of the block merged into each round
      std::vector<int> done(static_cast<size_t>(lanes), 0);
      for (const Step& st : part) {
        const size_t k = static_cast<size_t>(done[st.lane]++);
        if (per_round.size() <= k) per_round.resize(k + 1, 0);
        per_round[k] += !st.ops.empty();
      }
      part = sched::merge_rounds(part);  // (drops the rounds without an operation)
      if (merged)
        for (int n : per_round)
          if (n > 0) merged->push_back(n > 1);
    } else {
      for (Step& st : part) st.lane = 0;
      if (merged) merged->insert(merged->end(), part.size(), false);
    }
    out.steps.insert(out.steps.end(), part.begin(), part.end());
  }
  return out;
}

}  // namespace commlib
