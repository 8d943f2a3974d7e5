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
#include <stdexcept>
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

// The intra-host phases through CollArgs::intra_algorithm (a name registered for reduce_scatter
// and all_gather) on the host's sub-group. The host's ranges of a segment differ by up to a block
// (B blocks over L ranks), while a registered collective moves equal blocks: each range is packed
// into a slot of the host's largest range (the rest of the slot filled from the input, so nothing
// undefined travels; its result is dropped), the sub-collective runs on the slots, and the result
// is unpacked. Scratch: [L slots][L result slots][the sub-collective's scratch]; the phases run
// one after another, so they share it with the inter phase's.
struct IntraPhases {
  const Layout& y;
  const std::string& algo;
  int64_t pad0;  // the largest range of segment 0 (segment 0 is the longest): the slot stride

  IntraPhases(const Layout& layout, const std::string& name) : y(layout), algo(name), pad0(pad(0)) {}
  int64_t pad(int t) const {
    int64_t p = 0;
    for (int j = 0; j < y.L; ++j) p = std::max(p, y.range(BufferId::Input, t, j).count);
    return p;
  }
  int64_t scratch_end() const { return 2 * y.L * pad0 + sub_scratch_; }
  Subgroup group() const {
    Subgroup g;
    g.members = y.m.hosts[y.h];
    g.input = Rebase{BufferId::Scratch, 0};
    g.output = Rebase{BufferId::Scratch, y.L * pad0};
    g.scratch = Rebase{BufferId::Scratch, 2 * y.L * pad0};
    return g;
  }
  // Copies `src` into the slot at `slot_off` of `p` elements, the rest from segment t's input.
  void pack(Step& st, int64_t slot_off, Region src, int t, int64_t p) const {
    st.ops.push_back(op_copy(scratch_region(slot_off, src.count), src));
    const Region seg = y.span(BufferId::Input, t, 0, y.B);
    if (p > src.count) st.ops.push_back(op_copy(scratch_region(slot_off + src.count, p - src.count), Region{BufferId::Input, seg.offset, p - src.count}));
  }
  std::vector<Step> rs(int t) {
    const int64_t p = pad(t);
    if (y.L == 1 || p == 0) return y.rs(t);
    Schedule s;
    Step in;
    for (int j = 0; j < y.L; ++j) pack(in, j * p, y.range(BufferId::Input, t, j), t, p);
    s.steps.push_back(std::move(in));
    note(append_to(s, on_subgroup(Collective::ReduceScatter, algo, y.r, p, 0, group(), "intra_algorithm")));
    const Region mine = y.range(BufferId::Output, t, y.i);
    if (mine.count) s.steps.push_back(Step{{op_copy(mine, scratch_region(y.L * pad0, mine.count))}});
    return s.steps;
  }
  std::vector<Step> ag(int t) {
    const int64_t p = pad(t);
    if (y.L == 1 || p == 0) return {};
    Schedule s;
    Step in;
    pack(in, 0, y.range(BufferId::Output, t, y.i), t, p);
    s.steps.push_back(std::move(in));
    note(append_to(s, on_subgroup(Collective::AllGather, algo, y.r, p, 0, group(), "intra_algorithm")));
    Step out;
    for (int j = 0; j < y.L; ++j) {
      const Region theirs = y.range(BufferId::Output, t, j);
      if (j != y.i && theirs.count) out.ops.push_back(op_copy(theirs, scratch_region(y.L * pad0 + j * p, theirs.count)));
    }
    if (!out.ops.empty()) s.steps.push_back(std::move(out));
    return s.steps;
  }

 private:
  int64_t sub_scratch_ = 0;
  static int64_t append_to(Schedule& s, const Schedule& more) {
    s.steps.insert(s.steps.end(), more.steps.begin(), more.steps.end());
    return more.scratch_count;
  }
  void note(int64_t end) { sub_scratch_ = std::max(sub_scratch_, end - 2 * y.L * pad0); }
};

// Composed: (2) every owned block of a segment all-reduced in place by CollArgs::inter_algorithm
// on the sub-group of its owners (subgroup.h), whose scratch follows the reduce-scatter slots.
// Tick t: the all-gather of t-1 alone, then the inter phase of t beside the reduce-scatter of t+1.
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
  if (intra) {
    if (!algorithm_registered(Collective::ReduceScatter, a.intra_algorithm) ||
        !algorithm_registered(Collective::AllGather, a.intra_algorithm))
      throw std::invalid_argument("intra_algorithm: all_reduce's intra-host phases need a name registered for both "
                                  "reduce_scatter and all_gather, got '" + a.intra_algorithm + "'");
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
  return y.K > 1 ? all_reduce_pipelined(y) : all_reduce_plain(y);
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "hierarchical", all_reduce_hierarchical, 8, kLargeMessages,
                           "reduce-scatter within hosts, all-reduce of each block across hosts, all-gather within hosts");

}  // namespace sched
}  // namespace commlib
