// The simulator's run of a laned call in list order (run.h): a rank's list steps, each in its lane,
// enter once their lane's previous step, step i - window and, under an intra window
// (ir.h Schedule::intra_window), their gate have finished. Here: the bookkeeping Run keeps for it.
#include "sim/run.h"

namespace commlib {
namespace sim {
namespace detail {

void Run::set_list_order(const std::vector<std::vector<int>>* gates) {
  if (static_cast<int>(order_lanes_->size()) != P_) throw std::logic_error("simulate: a list order per rank expected");
  next_.assign(P_, 0);
  done_.resize(P_);
  for (int r = 0; r < P_; ++r) done_[r].assign((*order_lanes_)[r].size(), -1.0);
  ready_.assign(V_, -1.0);
  cur_.assign(V_, 0);
  pos_.assign(V_, SIZE_MAX);
  nxt_.resize(P_);
  for (int r = 0; r < P_; ++r) {  // each list step's next in its lane, and each lane's first
    const std::vector<uint16_t>& o = (*order_lanes_)[r];
    nxt_[r].assign(o.size(), SIZE_MAX);
    std::vector<size_t> last(W_, SIZE_MAX);
    for (size_t i = 0; i < o.size(); ++i) {
      if (last[o[i]] == SIZE_MAX) pos_[r * W_ + o[i]] = i;
      else nxt_[r][last[o[i]]] = i;
      last[o[i]] = i;
    }
  }
  if (gates && static_cast<int>(gates->size()) == P_) {  // each gate's one step it holds (a sliding window)
    gates_ = gates;
    wakes_.resize(P_);
    for (int r = 0; r < P_; ++r) {
      const std::vector<int>& g = (*gates)[r];
      if (g.empty()) continue;
      wakes_[r].assign(g.size(), -1);
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i] >= 0) wakes_[r][g[i]] = static_cast<int>(i);
    }
  }
}

}  // namespace detail
}  // namespace sim
}  // namespace commlib
