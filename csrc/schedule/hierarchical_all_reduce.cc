// Hierarchical all_reduce (registered in hierarchical.cc). B = max ranks per host blocks; local
// index j of host g owns blocks [j*B/L_g, (j+1)*B/L_g): at least one, contiguous, so ranks on
// smaller hosts own several. (1) within each host, local rank i reduces its range over the host's
// ranks (direct reduce-scatter, local rank order); (2) the owners of a block (one per host)
// exchange their partials and reduce them in host order; (3) within each host, owners send their
// range to every local peer. Every element is reduced in the same order (local ranks, then hosts)
// wherever it is computed: bitwise identical on every rank.
//
// Pipelined when there are two hosts or more and the message spans two segments or more
// (CollArgs::segment elements, from COMMLIB_HIER_SEGMENT; at most kMaxSegments), on equal and uneven hosts alike: see
// all_reduce_pipelined.
#include <algorithm>
#include <string>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"

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

// The plain all_reduce cut into K segments (each split into B blocks, owned as above) and run as a
// pipeline so the shared-memory phases hide behind the inter-host link. Tick t:
//   step A   inter-host exchange of segment t  ||  intra-host reduce-scatter sends of segment t+1
//   steps B  the ordered reductions of both (disjoint regions); the first B step also carries
//            the intra-host all-gather of segment t-1.
// Inter-host exchange: the ranges of two owners on different hosts intersect in one contiguous run
// of blocks (both ranges are contiguous), so each such pair swaps that run as one message; the
// parts from host g land at their place in g's scratch slot, which then covers this rank's whole
// range. The pairs and runs do not depend on t, and every rank's communicating steps are A and the
// first B of each tick, so sends and receives pair up tick by tick whatever the host sizes (the
// steps between only reduce locally and never wait).
Schedule all_reduce_pipelined(const CollArgs& a, const HostMap& m, int K) {
  const int r = a.rank, h = m.host[r], i = m.local[r], L = m.L(h), H = m.H(), B = m.max_L();
  const int64_t n = a.count;
  auto first = [&](int g, int j) { return j * B / m.L(g); };
  auto span = [&](BufferId buf, int t, int b0, int b1) {  // blocks [b0, b1) of segment t
    const int64_t so = blk_off(n, K, t), sl = blk_len(n, K, t), o = blk_off(sl, B, b0);
    return Region{buf, so + o, blk_off(sl, B, b1) - o};
  };
  auto range = [&](BufferId buf, int t, int j) { return span(buf, t, first(h, j), first(h, j + 1)); };
  const int64_t max_range = range(BufferId::Input, 0, i).count;  // segment 0 is the largest
  const int64_t x_base = (L - 1) * max_range;                     // scratch: [rs slots][x slots]
  Schedule s;
  s.scratch_count = (L - 1 + H - 1) * max_range;
  auto chain = [](Region dst, const std::vector<Region>& srcs, int own) {
    Schedule tmp;
    append_ordered_reduce(tmp, dst, srcs, own);
    return tmp.steps;
  };
  auto rs_comm = [&](int t, Step& x) {
    for (int j = 0, slot = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, range(BufferId::Input, t, j)));
      x.ops.push_back(op_recv(q, scratch_region(slot++ * max_range, range(BufferId::Input, t, i).count)));
    }
  };
  auto rs_reduce = [&](int t) {
    const Region mine_in = range(BufferId::Input, t, i), mine_out = range(BufferId::Output, t, i);
    if (L == 1) return std::vector<Step>{Step{{op_copy(mine_out, mine_in)}}};
    std::vector<Region> srcs(L);
    for (int j = 0, slot = 0; j < L; ++j)
      srcs[j] = j == i ? mine_in : scratch_region(slot++ * max_range, mine_in.count);
    return chain(mine_out, srcs, i);
  };
  auto x_comm = [&](int t, Step& x) {
    const Region mine = range(BufferId::Output, t, i);
    const int b0 = first(h, i), b1 = first(h, i + 1);
    for (int g = 0, slot = 0; g < H; ++g) {
      if (g == h) continue;
      for (int j = 0; j < m.L(g); ++j) {
        const int lo = std::max(b0, first(g, j)), hi = std::min(b1, first(g, j + 1));
        if (lo >= hi) continue;
        const Region run = span(BufferId::Output, t, lo, hi);
        x.ops.push_back(op_send(m.hosts[g][j], run));
        x.ops.push_back(op_recv(m.hosts[g][j], scratch_region(x_base + slot * max_range + run.offset - mine.offset, run.count)));
      }
      ++slot;
    }
  };
  auto x_reduce = [&](int t) {
    const Region mine = range(BufferId::Output, t, i);
    std::vector<Region> srcs(H);
    for (int g = 0, slot = 0; g < H; ++g)
      srcs[g] = g == h ? mine : scratch_region(x_base + slot++ * max_range, mine.count);
    return chain(mine, srcs, h);
  };
  auto ag_comm = [&](int t, Step& x) {
    for (int j = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, range(BufferId::Output, t, i)));
      x.ops.push_back(op_recv(q, range(BufferId::Output, t, j)));
    }
  };
  auto append = [](Step& dst, const Step& src) { dst.ops.insert(dst.ops.end(), src.ops.begin(), src.ops.end()); };
  for (int t = -1; t <= K; ++t) {
    const bool x_now = t >= 0 && t < K, rs_next = t + 1 < K, ag_prev = t >= 1 && t - 1 < K;
    Step A;
    if (x_now) x_comm(t, A);
    if (rs_next) rs_comm(t + 1, A);
    if (!A.ops.empty()) s.steps.push_back(std::move(A));
    const std::vector<Step> rs = rs_next ? rs_reduce(t + 1) : std::vector<Step>{};
    const std::vector<Step> xr = x_now ? x_reduce(t) : std::vector<Step>{};
    const size_t len = std::max({rs.size(), xr.size(), size_t{ag_prev ? 1u : 0u}});
    for (size_t k = 0; k < len; ++k) {
      Step B;
      if (k < rs.size()) append(B, rs[k]);
      if (k < xr.size()) append(B, xr[k]);
      if (k == 0 && ag_prev) ag_comm(t - 1, B);
      if (!B.ops.empty()) s.steps.push_back(std::move(B));
    }
  }
  return s;
}

}  // namespace

Schedule all_reduce_hierarchical(const CollArgs& a) {
  const HostMap m(a);
  if (!a.inter_algorithm.empty()) return all_reduce_composed(a, m);
  const int K = pipeline_segments(a, m);
  if (K > 1) return all_reduce_pipelined(a, m, K);
  const int r = a.rank, h = m.host[r], i = m.local[r], L = m.L(h), H = m.H(), B = m.max_L();
  const int64_t n = a.count;
  auto first_block = [&](int g, int j) { return j * B / m.L(g); };
  auto owner = [&](int g, int b) {
    int j = 0;
    while (first_block(g, j + 1) <= b) ++j;
    return m.hosts[g][j];
  };
  auto range = [&](BufferId buf, int g, int j) {
    const int64_t o = blk_off(n, B, first_block(g, j));
    return Region{buf, o, blk_off(n, B, first_block(g, j + 1)) - o};
  };
  Schedule s;
  const Region mine_out = range(BufferId::Output, h, i), mine_in = range(BufferId::Input, h, i);
  // (1) reduce-scatter within the host.
  if (L == 1) {
    s.steps.push_back(Step{{op_copy(mine_out, mine_in)}});
  } else {
    Step x;
    std::vector<Region> srcs(L);
    for (int j = 0, slot = 0; j < L; ++j) {
      if (j == i) {
        srcs[j] = mine_in;
        continue;
      }
      const int q = m.hosts[h][j];
      srcs[j] = scratch_region(slot++ * mine_in.count, mine_in.count);
      x.ops.push_back(op_send(q, range(BufferId::Input, h, j)));
      x.ops.push_back(op_recv(q, srcs[j]));
    }
    s.steps.push_back(std::move(x));
    append_ordered_reduce(s, mine_out, srcs, i);
    s.scratch_count = (L - 1) * mine_in.count;
  }
  // (2) all-reduce of each owned block across hosts.
  if (H > 1) {
    for (int b = first_block(h, i); b < first_block(h, i + 1); ++b) {
      const Region blk = out_region(blk_off(n, B, b), blk_len(n, B, b));
      Step x;
      std::vector<Region> srcs(H);
      for (int g = 0, slot = 0; g < H; ++g) {
        if (g == h) {
          srcs[g] = blk;
          continue;
        }
        const int q = owner(g, b);
        srcs[g] = scratch_region(slot++ * blk.count, blk.count);
        x.ops.push_back(op_send(q, blk));
        x.ops.push_back(op_recv(q, srcs[g]));
      }
      s.steps.push_back(std::move(x));
      append_ordered_reduce(s, blk, srcs, h);
      s.scratch_count = std::max(s.scratch_count, (H - 1) * blk.count);
    }
  }
  // (3) all-gather within the host.
  if (L > 1) {
    Step x;
    for (int j = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, mine_out));
      x.ops.push_back(op_recv(q, range(BufferId::Output, h, j)));
    }
    s.steps.push_back(std::move(x));
  }
  return s;
}

}  // namespace sched
}  // namespace commlib
