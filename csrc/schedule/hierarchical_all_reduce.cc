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
// are one `Layout` shared by the three schedules; the two pipelines order a tick differently (see
// each), because a composed inter phase may take many steps.
#include <algorithm>
#include <string>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/registry.h"
#include "schedule/subgroup.h"

namespace commlib {
namespace sched {

namespace {

// Segments cap the per-step overhead (one header and one wake-up per peer per step).
constexpr int kMaxSegments = 16;

// 1 (the plain schedule) unless there are two hosts or more (else there is no inter-host transfer
// to overlap) and the message spans two segments.
int pipeline_segments(const CollArgs& a, const HostMap& m) {
  if (m.H() < 2 || a.segment <= 0) return 1;
  return static_cast<int>(std::clamp<int64_t>(a.count / a.segment, 1, kMaxSegments));
}

std::vector<Step> ordered_reduce_steps(Region dst, const std::vector<Region>& srcs, int own) {
  Schedule tmp;
  append_ordered_reduce(tmp, dst, srcs, own);
  return tmp.steps;
}

// The block layout of K segments and the intra-host phases, from this rank's point of view.
// Scratch: [L-1 reduce-scatter receive slots of max_range][what the inter phase needs].
struct Layout {
  const HostMap& m;
  int K, r, h, i, L, H, B;
  int64_t n, max_range;

  Layout(const CollArgs& a, const HostMap& hosts, int segments)
      : m(hosts), K(segments), r(a.rank), h(hosts.host[a.rank]), i(hosts.local[a.rank]), L(hosts.L(h)),
        H(hosts.H()), B(hosts.max_L()), n(a.count), max_range(range(BufferId::Input, 0, i).count) {}

  int first(int g, int j) const { return j * B / m.L(g); }
  int owner(int g, int b) const {
    int j = 0;
    while (first(g, j + 1) <= b) ++j;
    return m.hosts[g][j];
  }
  Region span(BufferId buf, int t, int b0, int b1) const {  // blocks [b0, b1) of segment t
    const int64_t so = blk_off(n, K, t), sl = blk_len(n, K, t), o = blk_off(sl, B, b0);
    return Region{buf, so + o, blk_off(sl, B, b1) - o};
  }
  Region range(BufferId buf, int t, int j) const { return span(buf, t, first(h, j), first(h, j + 1)); }
  int64_t rs_scratch() const { return (L - 1) * max_range; }

  // (1) reduce-scatter of segment t within the host: the messages, then the ordered reduction.
  void rs_comm(int t, Step& x) const {
    for (int j = 0, slot = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, range(BufferId::Input, t, j)));
      x.ops.push_back(op_recv(q, scratch_region(slot++ * max_range, range(BufferId::Input, t, i).count)));
    }
  }
  std::vector<Step> rs_reduce(int t) const {
    const Region mine_in = range(BufferId::Input, t, i), mine_out = range(BufferId::Output, t, i);
    if (L == 1) return {Step{{op_copy(mine_out, mine_in)}}};
    std::vector<Region> srcs(L);
    for (int j = 0, slot = 0; j < L; ++j)
      srcs[j] = j == i ? mine_in : scratch_region(slot++ * max_range, mine_in.count);
    return ordered_reduce_steps(mine_out, srcs, i);
  }
  std::vector<Step> rs(int t) const {
    Step x;
    rs_comm(t, x);
    std::vector<Step> steps;
    if (!x.ops.empty()) steps.push_back(std::move(x));
    for (Step& st : rs_reduce(t)) steps.push_back(std::move(st));
    return steps;
  }
  // (3) all-gather of segment t within the host.
  void ag_comm(int t, Step& x) const {
    for (int j = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, range(BufferId::Output, t, i)));
      x.ops.push_back(op_recv(q, range(BufferId::Output, t, j)));
    }
  }
};

void append_steps(Schedule& s, std::vector<Step> steps) {
  for (Step& st : steps) s.steps.push_back(std::move(st));
}

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

// Built-in, K segments, run as a pipeline so the shared-memory phases hide behind the inter-host
// link. Tick t:
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
// Tick t: the all-gather of t-1 alone, then the inter phase of t beside the reduce-scatter of t+1.
// Intra-host messages only in a tick's first two steps, which a rank's local peers reach as soon
// as they finished the tick before: so no rank waits on a local peer that waits on an inter-host
// group (an all-gather beside the inter steps can: a rank of a smaller host serves several groups
// one after another, and its local peer's group may be the later one).
Schedule all_reduce_composed(const CollArgs& a, const Layout& y) {
  const int64_t x_base = y.rs_scratch();
  Schedule s;
  s.scratch_count = x_base;
  auto inter = [&](int t) {
    Schedule tmp;
    if (y.H < 2) return tmp.steps;
    for (int b = y.first(y.h, y.i); b < y.first(y.h, y.i + 1); ++b) {
      Subgroup g;
      for (int x = 0; x < y.H; ++x) g.members.push_back(y.owner(x, b));
      const Region blk = y.span(BufferId::Output, t, b, b + 1);
      g.input = g.output = Rebase{BufferId::Output, blk.offset};
      g.scratch = Rebase{BufferId::Scratch, x_base};
      append_schedule(tmp, on_subgroup(Collective::AllReduce, a.inter_algorithm, y.r, blk.count, 0, g));
    }
    s.scratch_count = std::max(s.scratch_count, tmp.scratch_count);
    return tmp.steps;
  };
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
  if (!a.inter_algorithm.empty()) return all_reduce_composed(a, y);
  return y.K > 1 ? all_reduce_pipelined(y) : all_reduce_plain(y);
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "hierarchical", all_reduce_hierarchical, 8, kLargeMessages,
                           "reduce-scatter within hosts, all-reduce of each block across hosts, all-gather within hosts");

}  // namespace sched
}  // namespace commlib
