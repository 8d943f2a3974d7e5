// all_reduce by recursive quartering (radix_exchange.h): rabenseifner's reduce-scatter and
// all-gather with groups of 4 ranks a round instead of pairs, one round of 2 where log2 P is odd.
#include "schedule/radix_exchange.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "schedule/builders.h"
#include "schedule/hierarchical_layout.h"

namespace commlib {
namespace sched {

Schedule all_reduce_radix4(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  if (P < 1 || (P & (P - 1)) != 0)
    throw std::invalid_argument("inter_algorithm: radix4 runs on a power-of-two group, got " + std::to_string(P) + " ranks");
  Schedule s;
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
    return s;
  }
  // The rounds from the top: (radix, stride) with strides P / 4, P / 16, .. and a last round of 2
  // where log2 P is odd. In the round of stride m the group is the ranks differing from r only in
  // the digit d = (r / m) % radix; before it r's range of blocks is the radix * m blocks from
  // (r / (radix m)) radix m, after it the m blocks from (r / m) m.
  std::vector<std::pair<int, int>> rounds;
  for (int m = P; m > 1;) {
    const int radix = m % 4 == 0 ? 4 : 2;
    m /= radix;
    rounds.emplace_back(radix, m);
  }
  auto blocks = [&](BufferId b, int lo, int hi) {
    const int64_t o = blk_off(n, P, lo);
    return Region{b, o, blk_off(n, P, hi) - o};
  };
  int64_t scratch = 0;
  bool output_holds_data = false;
  for (const auto& [radix, m] : rounds) {  // the reduce-scatter
    const int base = r / (radix * m) * (radix * m), d = r / m % radix;
    const Region keep = blocks(BufferId::Output, base + d * m, base + (d + 1) * m);
    Step x;
    std::vector<Region> later;  // the third and fourth ranks' parts, received into scratch
    bool first = true;
    for (int j = 0; j < radix; ++j) {
      if (j == d) continue;
      const int peer = r + (j - d) * m;
      x.ops.push_back(op_send(peer, blocks(output_holds_data ? BufferId::Output : BufferId::Input, base + j * m,
                                           base + (j + 1) * m)));
      if (first) {
        x.ops.push_back(output_holds_data ? op_recv_reduce(peer, keep)
                                          : op_recv_reduce_from(peer, keep, blocks(BufferId::Input, base + d * m,
                                                                                   base + (d + 1) * m)));
        first = false;
      } else {
        later.push_back(scratch_region(static_cast<int64_t>(later.size()) * keep.count, keep.count));
        x.ops.push_back(op_recv(peer, later.back()));
      }
    }
    s.steps.push_back(std::move(x));
    for (const Region& g : later) s.steps.push_back(Step{{op_reduce(keep, g)}});
    scratch = std::max(scratch, static_cast<int64_t>(later.size()) * keep.count);
    output_holds_data = true;
  }
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) {  // the all-gather, rounds reversed
    const auto [radix, m] = *it;
    const int base = r / (radix * m) * (radix * m), d = r / m % radix;
    Step x;
    for (int j = 0; j < radix; ++j) {
      if (j == d) continue;
      const int peer = r + (j - d) * m;
      x.ops.push_back(op_send(peer, blocks(BufferId::Output, base + d * m, base + (d + 1) * m)));
      x.ops.push_back(op_recv(peer, blocks(BufferId::Output, base + j * m, base + (j + 1) * m)));
    }
    s.steps.push_back(std::move(x));
  }
  s.scratch_count = scratch;
  return s;
}

std::vector<Step> radix4_inter_phase(const Layout& y, int t, int64_t x_base, int64_t& scratch_end) {
  return owners_phase(y, t, x_base, scratch_end, 1, [&](const Subgroup& g, int64_t count) {
    CollArgs sub;
    sub.coll = Collective::AllReduce;
    sub.rank = static_cast<int>(std::find(g.members.begin(), g.members.end(), y.r) - g.members.begin());
    sub.size = y.H;
    sub.count = count;
    return rebased_on(all_reduce_radix4(sub), g);
  });
}

}  // namespace sched
}  // namespace commlib
