// The overlapped pipeline of hierarchical all_reduce (docs/DESIGN.md "The schedule IR"): on hosts of
// equal size, with an inter-host algorithm (and any intra-host one, built-in or registered), tick t
// runs the inter-host phase of segment t in the same steps as the intra-host all-gather of segment
// t-1 and then the reduce-scatter of segment t+1, so a tick takes about the slower of the two and
// the call about K ticks of it plus one fill and one drain, not the sum of the phases.
//
// Two lanes per rank and tick: the inter lane (its block's owners, one per host: peers on other
// hosts; a registered algorithm on their sub-group, or the built-in exchange, exchange_lane) and
// the intra lane (its host's ranks). Their peers are disjoint, so zipping them breaks no
// rule of a step, and the regions are disjoint: segments t, t-1 and t+1, and separate scratch (the
// intra lane's past the inter lane's). A rank of an intra lane that waited on a local peer stuck
// behind that peer's inter group could deadlock; so the intra lanes of a host are aligned in rounds
// (align_rounds: each message's two ends at one index of every local rank's lane), which leaves a
// local peer's intra step only ever waiting on steps its own rank reaches first. On equal hosts
// every rank owns one block of each segment, so its inter lane is one group's schedule, like every
// local peer's; on unequal hosts a rank serves several groups one after another and the composed
// schedule keeps its sequential tick (hierarchical_all_reduce.cc).
#include "schedule/hierarchical_layout.h"
#include "schedule/overlap_intra.h"

#include <cmath>
#include <cstdint>
#include <limits>

namespace commlib {
namespace sched {

namespace {

// Pieces a lane's segment may be cut into at most unless CollArgs::pieces says (the cost model's
// policy chooses it, policy/pipeline_shape.h), and the fewest elements of a block's piece.
constexpr int64_t kMaxChunks = 8;
constexpr int64_t kMinPiece = 4096;

bool equal_hosts(const HostMap& m) {
  for (int g = 1; g < m.H(); ++g)
    if (m.L(g) != m.L(0)) return false;
  return true;
}

// One tick's steps: the intra lane's rounds (intra_talks[k]: some local rank sends or receives in
// round k) and the inter lane's steps merged by progress through the tick, so that the talking
// inter steps spread over the talking rounds (a step runs as long as the slower of the two), and a
// step of copies and reductions only goes alone: the c-th of C talking rounds spans [c/C,
// (c+1)/C) of the tick, the e-th of E talking inter steps [e/E, (e+1)/E); the next two share a
// step when their spans overlap, else the one that ends first goes alone. Every local rank has the
// same rounds and talks, and the same inter steps (one group's schedule on equal hosts), so the
// local ranks' merged ticks line up round for round.
std::vector<Step> merge_by_progress(const std::vector<Step>& intra, const std::vector<bool>& intra_talks,
                                    const std::vector<Step>& inter) {
  const int64_t C = std::max<int64_t>(1, std::count(intra_talks.begin(), intra_talks.end(), true));
  const int64_t E = std::max<int64_t>(1, std::count_if(inter.begin(), inter.end(), step_talks));
  std::vector<Step> out;
  size_t k = 0, e = 0;
  int64_t c_done = 0, e_done = 0;  // talking steps already placed, per lane
  auto push = [&](const Step& st) {
    if (!st.ops.empty()) out.push_back(st);
  };
  while (k < intra.size() || e < inter.size()) {
    const bool intra_left = k < intra.size(), inter_left = e < inter.size();
    if (intra_left && !intra_talks[k]) {
      push(intra[k++]);
    } else if (inter_left && !step_talks(inter[e])) {
      push(inter[e++]);
    } else if (!inter_left || (intra_left && (c_done + 1) * E <= e_done * C)) {  // round ends before the step starts
      push(intra[k++]), ++c_done;
    } else if (!intra_left || (e_done + 1) * C <= c_done * E) {  // the step ends before the round starts
      push(inter[e++]), ++e_done;
    } else {
      Step both = intra[k++];
      both.ops.insert(both.ops.end(), inter[e].ops.begin(), inter[e].ops.end());
      push(both);
      ++e, ++c_done, ++e_done;
    }
  }
  return out;
}

// merge_by_elements: the pairing for lanes whose talking steps differ in size (rail_halving: halving
// then doubling on both lanes). Each talking step weighs its elements through its link
// (`intra_w`: a round's, `inter_w`: an inter step's, one per talking step, the same on every rank,
// so every rank pairs alike), an inter step's times `nic_share` (the local ranks sharing the host's
// NICs: on a rail-optimised host one NIC per local rank moves about 1/L of what a port does in the
// same time, so an inter step of 1/L of a round's elements takes as long), and the pairing is the
// one of least total, a merged step costing the larger of its two weights (a step lasts as long as
// its slower half) plus kStepCost of the lanes' larger total (every step pays a latency): a shortest
// path through the (round, step) grid, O(C E). So the reduce-scatter's round of half the segment
// goes beside the inter lane's step of half its block, as a count would not pair them. Of equal
// totals the pairs of nearer halves win (kMismatch), then pairing, then the intra round. Steps of copies and reductions go alone where their lane has
// them, as in merge_by_progress.
constexpr double kStepCost = 1e-3;
constexpr double kMismatch = 1e-6;

std::vector<Step> merge_by_elements(const std::vector<Step>& intra, const std::vector<bool>& intra_talks,
                                    const std::vector<Step>& inter, const std::vector<int64_t>& intra_w,
                                    const std::vector<int64_t>& inter_w, int nic_share) {
  const size_t C = intra_w.size(), E = inter_w.size();
  std::vector<double> wi(intra_w.begin(), intra_w.end()), we(inter_w.begin(), inter_w.end());
  double ti = 0, te = 0;
  for (double& w : we) w *= nic_share;
  for (double w : wi) ti += w;
  for (double w : we) te += w;
  const double step_cost = kStepCost * std::max(1.0, std::max(ti, te));
  // cost[c][e]: least cost of the rest from c rounds and e inter steps placed; how: 0 both, 1 round, 2 step.
  std::vector<std::vector<double>> cost(C + 1, std::vector<double>(E + 1, 0.0));
  std::vector<std::vector<char>> how(C + 1, std::vector<char>(E + 1, 0));
  for (size_t c = C + 1; c-- > 0;)
    for (size_t e = E + 1; e-- > 0;) {
      if (c == C && e == E) continue;
      double best = std::numeric_limits<double>::infinity();
      char pick = 0;
      if (c < C && e < E)  // a pair of unequal halves costs a hair more: of equal totals, the matched pairs
        best = std::max(wi[c], we[e]) + kMismatch * std::abs(wi[c] - we[e]) + step_cost + cost[c + 1][e + 1], pick = 0;
      if (c < C && wi[c] + step_cost + cost[c + 1][e] < best) best = wi[c] + step_cost + cost[c + 1][e], pick = 1;
      if (e < E && we[e] + step_cost + cost[c][e + 1] < best) best = we[e] + step_cost + cost[c][e + 1], pick = 2;
      cost[c][e] = best, how[c][e] = pick;
    }
  std::vector<Step> out;
  size_t k = 0, x = 0, c = 0, e = 0;
  auto push = [&](const Step& st) {
    if (!st.ops.empty()) out.push_back(st);
  };
  while (k < intra.size() || x < inter.size()) {
    if (k < intra.size() && !intra_talks[k]) {
      push(intra[k++]);
    } else if (x < inter.size() && !step_talks(inter[x])) {
      push(inter[x++]);
    } else {
      // Both heads talk (or a lane is done); the weights count exactly these steps.
      const char pick = (c < C && e < E) || c < C || e < E ? how[c][e] : 1;
      if (pick == 0) {
        Step both = intra[k++];
        both.ops.insert(both.ops.end(), inter[x].ops.begin(), inter[x].ops.end());
        push(both);
        ++x, ++c, ++e;
      } else if (pick == 1) {
        push(intra[k++]), ++c;
      } else {
        push(inter[x++]), ++e;
      }
    }
  }
  return out;
}

// The built-in inter-host exchange of segment t as a lane: on equal hosts local rank i owns block
// i, which it swaps with that block's owners on the other hosts, in `pieces` pieces one after
// another, each reduced in host order (every owner alike, as the plain schedule does). Scratch from
// x_base: H - 1 slots of a piece; raises scratch_end to cover it.
std::vector<Step> exchange_lane(const Layout& y, int t, int64_t x_base, int64_t& scratch_end, int pieces) {
  Schedule tmp;
  const int b = y.first(y.h, y.i);
  const Region blk = y.span(BufferId::Output, t, b, b + 1);
  const int64_t stride = blk_len(blk.count, pieces, 0);  // the first piece is the longest
  for (int q = 0; q < pieces; ++q) {
    const Region part{BufferId::Output, blk.offset + blk_off(blk.count, pieces, q), blk_len(blk.count, pieces, q)};
    Step x;
    std::vector<Region> srcs(y.H);
    for (int g = 0, slot = 0; g < y.H; ++g) {
      if (g == y.h) {
        srcs[g] = part;
        continue;
      }
      srcs[g] = scratch_region(x_base + slot++ * stride, part.count);
      x.ops.push_back(op_send(y.owner(g, b), part));
      x.ops.push_back(op_recv(y.owner(g, b), srcs[g]));
    }
    tmp.steps.push_back(std::move(x));
    append_ordered_reduce(tmp, part, srcs, y.h);
  }
  scratch_end = std::max(scratch_end, x_base + (y.H - 1) * stride);
  return tmp.steps;
}

// Segment t's inter lane: CollArgs::inter_algorithm on the owners' sub-group, or the built-in
// exchange when it is empty.
std::vector<Step> inter_lane(const CollArgs& a, const Layout& y, int t, int64_t x_base, int64_t& scratch_end,
                             int pieces = 1) {
  if (a.inter_algorithm.empty()) return exchange_lane(y, t, x_base, scratch_end, pieces);
  return inter_phase(a, y, t, x_base, scratch_end, pieces);
}

// Talking steps of segment t's inter lane of this rank's group as its member on host 0 has them.
int64_t group_steps_on_host0(const CollArgs& a, const Layout& y, int t, int64_t x_base) {
  CollArgs a0 = a;
  a0.rank = y.m.hosts[0][y.i];
  const Layout y0 = y.as_rank(a0);
  int64_t ignored = 0;
  const std::vector<Step> lane = inter_lane(a0, y0, t, x_base, ignored);
  return std::count_if(lane.begin(), lane.end(), step_talks);
}

}  // namespace


Schedule all_reduce_overlapped(const CollArgs& a, const Layout& y, const OverlapShape& shape) {
  Schedule s;
  if (y.H < 2 || y.K < 2 || !equal_hosts(y.m)) return s;
  // Scratch: [built-in reduce-scatter slots][the inter lane's][the registered intra phases'].
  const bool named_intra = !a.intra_algorithm.empty() || !shape.intra_rs.empty();
  const int64_t x_base = named_intra ? 0 : y.rs_scratch();
  int64_t x_end = x_base;
  for (int t = 0; t < y.K; ++t) inter_lane(a, y, t, x_base, x_end);
  s.scratch_count = x_end;
  // A tick's talking steps pair one intra round with one inter step, so the lane with fewer runs
  // its segment in pieces (CollArgs::pieces at most, else kMaxChunks), up to as many talking steps
  // as the other; none of a block smaller than kMinPiece (a piece's messages must stay large
  // enough that their per-message costs do not dominate). A function of the segment's length and
  // the cap alone, so the candidate search's estimate from the first segments (candidate_search.h)
  // cuts alike.
  const int64_t block = y.span(BufferId::Input, 0, 0, 1).count;
  const int64_t most = std::clamp<int64_t>(block / kMinPiece, 1, a.pieces > 0 ? a.pieces : kMaxChunks);
  auto pieces = [&](int64_t mine, int64_t other) { return mine == 0 ? 1 : std::min<int64_t>(most, (other + mine - 1) / mine); };
  for (int t = -1; t <= y.K; ++t) {
    int64_t ignored = 0;  // within x_end (smaller pieces need no more scratch than the whole block)
    const bool x_now = t >= 0 && t < y.K;
    std::vector<Step> lane = x_now ? inter_lane(a, y, t, x_base, ignored) : std::vector<Step>{};
    std::vector<bool> talks;
    if (shape.by_elements) {  // paired by elements, uncut
      std::vector<int64_t> intra_w, inter_w;
      std::vector<Step> mine = aligned_intra(a, y, t, 1, x_end, s.scratch_count, talks, shape, &intra_w);
      if (x_now) {  // the weights of one rank's inter lane (host 0's first), the same for every rank
        CollArgs a0 = a;
        a0.rank = y.m.hosts[0][0];
        const Layout y0 = y.as_rank(a0);
        for (const Step& st : inter_lane(a0, y0, t, x_base, ignored))
          if (step_talks(st)) inter_w.push_back(step_elements(st));
      }
      if (std::count_if(lane.begin(), lane.end(), step_talks) == static_cast<int64_t>(inter_w.size())) {
        append_steps(s, merge_by_elements(mine, talks, lane, intra_w, inter_w, y.L));
        continue;
      }  // a lane unlike host 0's (not on the hosts rail_halving pairs by elements): by count
      append_steps(s, merge_by_progress(mine, talks, lane));
      continue;
    }
    std::vector<Step> mine = aligned_intra(a, y, t, 1, x_end, s.scratch_count, talks, shape);
    const int64_t rounds = std::count(talks.begin(), talks.end(), true);
    // Every member of an inter group must cut alike, but their lanes may differ (a folded rank
    // talks less), so the group's cut follows its host-0 member's lane; the host's intra cut
    // follows this rank's (its local peers are the same member of their groups).
    const int64_t steps = std::count_if(lane.begin(), lane.end(), step_talks);
    const int64_t steps0 = !x_now || y.h == 0 ? steps : group_steps_on_host0(a, y, t, x_base);
    if (rounds > steps0 && steps0 > 0) {
      lane = inter_lane(a, y, t, x_base, ignored, static_cast<int>(pieces(steps0, rounds)));
    } else if (steps > rounds && rounds > 0) {
      mine = aligned_intra(a, y, t, static_cast<int>(pieces(rounds, steps)), x_end, s.scratch_count, talks, shape);
    }
    append_steps(s, merge_by_progress(mine, talks, lane));
  }
  return s;
}

}  // namespace sched
}  // namespace commlib
