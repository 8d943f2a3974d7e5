// Hierarchical all_reduce, built and registered here. B = max ranks per host blocks; local index j
// of host g owns blocks [j*B/L_g, (j+1)*B/L_g): at least one, contiguous, so ranks on smaller
// hosts own several. (1) within each host, local rank i reduces its range over the host's ranks
// (direct reduce-scatter, local rank order); (2) the owners of a block (one per host) all-reduce it
// across hosts; (3) within each host, owners send their range to every local peer. Every element
// is reduced in the same order (local ranks, then hosts) wherever it is computed: bitwise identical
// on every rank.
//
// Phase (2) is a direct exchange of partials (built-in), or any registered all_reduce run on the
// owners' sub-group when CollArgs::inter_algorithm is set (composed). Both are pipelined when there
// are two hosts or more and the message spans two segments or more (CollArgs::segment elements; at
// most kMaxSegments), on equal and uneven hosts alike. Phases (1) and (3) and the segment layout
// are one `Layout` (hierarchical_layout.h) shared by the schedules; the pipelines order a tick
// differently (see each), because a composed inter phase may take many steps. On hosts of equal
// size every pipeline, built-in or composed, is the overlapped one (hierarchical_overlap.cc): every
// rank's intra phases of t-1 and t+1 in the same steps as its inter phase of t.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/hierarchical_layout.h"
#include "schedule/registry.h"
#include "schedule/subgroup.h"

namespace commlib {
namespace sched {

namespace {

// Built-in, one segment: (2) each owned block exchanged with its owners on the other hosts.
Schedule all_reduce_plain(const Layout& y) {
  Schedule s;
  s.scratch_count = y.rs_scratch();
  append_steps(s, y.rs(0));
  for (int b = y.first(y.h, y.i); b < y.first(y.h, y.i + 1) && y.H > 1; ++b) {
    const Region blk = y.span(BufferId::Output, 0, b, b + 1);
    Step x;
    std::vector<Region> srcs(y.H);
    for (int g = 0, slot = 0; g < y.H; ++g) {
      if (g == y.h) {
        srcs[g] = blk;
        continue;
      }
      const int q = y.owner(g, b);
      srcs[g] = scratch_region(slot++ * blk.count, blk.count);
      x.ops.push_back(op_send(q, blk));
      x.ops.push_back(op_recv(q, srcs[g]));
    }
    s.steps.push_back(std::move(x));
    append_ordered_reduce(s, blk, srcs, y.h);
    s.scratch_count = std::max(s.scratch_count, (y.H - 1) * blk.count);
  }
  Step x;
  y.ag_comm(0, x);
  if (!x.ops.empty()) s.steps.push_back(std::move(x));
  return s;
}

// Built-in, K segments on hosts of unequal size (equal hosts run the overlapped pipeline, whose
// built-in inter lane is the same exchange), run as a pipeline so the shared-memory phases hide
// behind the inter-host link. Tick t:
//   step A   inter-host exchange of segment t  ||  intra-host reduce-scatter sends of segment t+1
//   steps B  the ordered reductions of both (disjoint regions); the first B step also carries
//            the intra-host all-gather of segment t-1.
// Inter-host exchange: the ranges of two owners on different hosts intersect in one contiguous run
// of blocks (both ranges are contiguous), so each such pair swaps that run as one message; the
// parts from host g land at their place in g's scratch slot, which then covers this rank's whole
// range. The pairs and runs do not depend on t, and every rank's communicating steps are A and the
// first B of each tick, so sends and receives pair up tick by tick whatever the host sizes (the
// steps between only reduce locally and never wait).
Schedule all_reduce_pipelined(const Layout& y) {
  const HostMap& m = y.m;
  const int h = y.h, i = y.i, H = y.H, K = y.K;
  const int64_t x_base = y.rs_scratch(), max_range = y.max_range;
  Schedule s;
  s.scratch_count = (y.L - 1 + H - 1) * max_range;
  auto x_comm = [&](int t, Step& x) {
    const Region mine = y.range(BufferId::Output, t, i);
    const int b0 = y.first(h, i), b1 = y.first(h, i + 1);
    for (int g = 0, slot = 0; g < H; ++g) {
      if (g == h) continue;
      for (int j = 0; j < m.L(g); ++j) {
        const int lo = std::max(b0, y.first(g, j)), hi = std::min(b1, y.first(g, j + 1));
        if (lo >= hi) continue;
        const Region run = y.span(BufferId::Output, t, lo, hi);
        x.ops.push_back(op_send(m.hosts[g][j], run));
        x.ops.push_back(op_recv(m.hosts[g][j], scratch_region(x_base + slot * max_range + run.offset - mine.offset, run.count)));
      }
      ++slot;
    }
  };
  auto x_reduce = [&](int t) {
    const Region mine = y.range(BufferId::Output, t, i);
    std::vector<Region> srcs(H);
    for (int g = 0, slot = 0; g < H; ++g)
      srcs[g] = g == h ? mine : scratch_region(x_base + slot++ * max_range, mine.count);
    return ordered_reduce_steps(mine, srcs, h);
  };
  auto append = [](Step& dst, const Step& src) { dst.ops.insert(dst.ops.end(), src.ops.begin(), src.ops.end()); };
  for (int t = -1; t <= K; ++t) {
    const bool x_now = t >= 0 && t < K, rs_next = t + 1 < K, ag_prev = t >= 1 && t - 1 < K;
    Step A;
    if (x_now) x_comm(t, A);
    if (rs_next) y.rs_comm(t + 1, A);
    if (!A.ops.empty()) s.steps.push_back(std::move(A));
    const std::vector<Step> rs = rs_next ? y.rs_reduce(t + 1) : std::vector<Step>{};
    const std::vector<Step> xr = x_now ? x_reduce(t) : std::vector<Step>{};
    const size_t len = std::max({rs.size(), xr.size(), size_t{ag_prev ? 1u : 0u}});
    for (size_t k = 0; k < len; ++k) {
      Step B;
      if (k < rs.size()) append(B, rs[k]);
      if (k < xr.size()) append(B, xr[k]);
      if (k == 0 && ag_prev) y.ag_comm(t - 1, B);
      if (!B.ops.empty()) s.steps.push_back(std::move(B));
    }
  }
  return s;
}

// Composed: (2) every owned block of a segment all-reduced in place by CollArgs::inter_algorithm
// on the sub-group of its owners (subgroup.h), whose scratch follows the reduce-scatter slots.
// Pipelined on equal hosts: the overlapped pipeline. Otherwise (unequal hosts, or one segment), tick t: the all-gather of t-1 alone, then the inter phase of t beside the reduce-scatter of t+1.
// Intra-host messages only in a tick's first two steps, which a rank's local peers reach as soon
// as they finished the tick before: so no rank waits on a local peer that waits on an inter-host
// group (an all-gather beside the inter steps can: a rank of a smaller host serves several groups
// one after another, and its local peer's group may be the later one).
// With CollArgs::intra_algorithm the intra phases take many steps each, and zipping them beside
// the inter steps can deadlock on uneven hosts for the same reason (a local peer's intra step
// waits behind its inter group); a tick then runs its phases one
// after another (all-gather of t-1, reduce-scatter of t+1, inter phase of t): every group meets
// its phases in one global order, so segments still flow through the hosts, but a rank's own
// phases no longer overlap.
Schedule all_reduce_composed(const CollArgs& a, const Layout& y) {
  const bool intra = !a.intra_algorithm.empty();
  const int64_t x_base = intra ? 0 : y.rs_scratch();
  Schedule s;
  s.scratch_count = x_base;
  auto inter = [&](int t) { return inter_phase(a, y, t, x_base, s.scratch_count); };
  if (intra) {
    if (!algorithm_registered(Collective::ReduceScatter, a.intra_algorithm) ||
        !algorithm_registered(Collective::AllGather, a.intra_algorithm))
      throw std::invalid_argument("intra_algorithm: all_reduce's intra-host phases need a name registered for both "
                                  "reduce_scatter and all_gather, got '" + a.intra_algorithm + "'");
  }
  if (Schedule overlapped = all_reduce_overlapped(a, y); !overlapped.steps.empty()) return overlapped;
  if (intra) {
    IntraPhases phases(y, a.intra_algorithm);
    for (int t = -1; t <= y.K; ++t) {
      if (t >= 1) append_steps(s, phases.ag(t - 1));
      if (t + 1 < y.K) append_steps(s, phases.rs(t + 1));
      if (t >= 0 && t < y.K) append_steps(s, inter(t));
    }
    s.scratch_count = std::max(s.scratch_count, phases.scratch_end());
    return s;
  }
  auto ag = [&](int t) {
    Step x;
    y.ag_comm(t, x);
    return x.ops.empty() ? std::vector<Step>{} : std::vector<Step>{std::move(x)};
  };
  if (y.K == 1) {
    append_steps(s, zip_steps({y.rs(0)}));
    append_steps(s, inter(0));
    append_steps(s, ag(0));
    return s;
  }
  for (int t = -1; t <= y.K; ++t) {
    if (t >= 1) append_steps(s, ag(t - 1));
    append_steps(s, zip_steps({t >= 0 && t < y.K ? inter(t) : std::vector<Step>{},
                               t + 1 < y.K ? y.rs(t + 1) : std::vector<Step>{}}));
  }
  return s;
}

}  // namespace

Schedule all_reduce_hierarchical(const CollArgs& a) {
  const HostMap m(a);
  const Layout y(a, m, pipeline_segments(a, m));
  if (!a.intra_algorithm.empty() && a.inter_algorithm.empty())
    throw std::invalid_argument("intra_algorithm: '" + a.intra_algorithm + "' needs an inter_algorithm too");
  if (!a.inter_algorithm.empty()) return all_reduce_composed(a, y);
  if (y.K == 1) return all_reduce_plain(y);
  if (Schedule overlapped = all_reduce_overlapped(a, y); !overlapped.steps.empty()) return overlapped;
  return all_reduce_pipelined(y);
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "hierarchical", all_reduce_hierarchical, 8, kLargeMessages,
                           "reduce-scatter within hosts, all-reduce of each block across hosts, all-gather within hosts");

}  // namespace sched
}  // namespace commlib
