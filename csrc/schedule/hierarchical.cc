// Hierarchical (topology-aware) schedules: the host map (CollArgs::host_of) decides who talks to
// whom, so that every byte crosses between hosts as few times as possible and the rest moves over
// fast intra-host links. Hosts may hold different numbers of ranks (2+1+3 works).
//
//   all_reduce      B = max ranks per host blocks. (1) within each host, local rank i reduces
//                   its contiguous range of blocks over the host's ranks (direct reduce-scatter,
//                   local rank order); (2) for each block, its owners (one per host) exchange
//                   their partials and reduce them in host order; (3) within each host, owners
//                   send their range to every local peer. Every element is reduced in the same
//                   order (local ranks, then hosts) wherever it is computed: bitwise identical.
//                   Pipelined when every host holds the same number of ranks and the message
//                   spans two segments or more (COMMLIB_HIER_SEGMENT elements; at most
//                   kMaxSegments): see all_reduce_pipelined.
//   all_gather      (1) every rank sends its block to one rank on each other host (local index
//                   i -> i mod L there); (2) each rank forwards its own and the blocks it
//                   received to its local peers, one block per round.
//   reduce_scatter  the mirror: (1) for every block, one collector per host (the owner itself on
//                   its host, local index i mod L on the others) reduces the host's
//                   contributions in local rank order, one block per round; (2) collectors send
//                   the host partials to the owner, which reduces them in host order.
//   broadcast       the root sends to the lowest rank of every other host and to its own local
//                   peers; those leaders send to their local peers.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/params.h"
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

// Hosts in order of their lowest rank, each with its ranks ascending.
struct HostMap {
  std::vector<std::vector<int>> hosts;
  std::vector<int> host, local;  // by rank
  explicit HostMap(const CollArgs& a) : host(a.size), local(a.size) {
    if (!a.host_of.empty() && static_cast<int>(a.host_of.size()) != a.size)
      throw std::invalid_argument("host_of: " + std::to_string(a.host_of.size()) + " entries for " +
                                  std::to_string(a.size) + " ranks");
    std::vector<int> ids;
    for (int r = 0; r < a.size; ++r) {
      const int id = a.host_of.empty() ? 0 : a.host_of[r];
      size_t h = 0;
      while (h < ids.size() && ids[h] != id) ++h;
      if (h == ids.size()) {
        ids.push_back(id);
        hosts.emplace_back();
      }
      host[r] = static_cast<int>(h);
      local[r] = static_cast<int>(hosts[h].size());
      hosts[h].push_back(r);
    }
  }
  int H() const { return static_cast<int>(hosts.size()); }
  int L(int h) const { return static_cast<int>(hosts[h].size()); }
  // The rank of host h that handles what local index i of another host sends.
  int partner(int h, int i) const { return hosts[h][i % L(h)]; }
};


// Segments cap the per-step overhead (one header and one wake-up per peer per step).
constexpr int kMaxSegments = 16;

// 1 (the plain schedule) unless hosts are equal, there are two or more of them (else there is no
// inter-host transfer to overlap) and the message spans two segments.
int pipeline_segments(const CollArgs& a, const HostMap& m) {
  if (m.H() < 2) return 1;
  for (int g = 1; g < m.H(); ++g)
    if (m.L(g) != m.L(0)) return 1;
  const int64_t seg = param_int("COMMLIB_HIER_SEGMENT", 1, INT64_MAX);
  return static_cast<int>(std::clamp<int64_t>(a.count / seg, 1, kMaxSegments));
}

// The plain all_reduce cut into K segments (local index i owns block i of every segment) and run
// as a pipeline so the shared-memory phases hide behind the inter-host link. Tick t:
//   step A   inter-host exchange of segment t  ||  intra-host reduce-scatter sends of segment t+1
//   steps B  the ordered reductions of both (disjoint regions); the first B step also carries
//            the intra-host all-gather of segment t-1.
// Every rank has the same step shape (equal hosts), so sends and receives pair up step by step;
// each element is still reduced in local rank order, then host order: bitwise identical.
Schedule all_reduce_pipelined(const CollArgs& a, const HostMap& m, int K) {
  const int r = a.rank, h = m.host[r], i = m.local[r], L = m.L(h), H = m.H();
  const int64_t n = a.count;
  auto block = [&](BufferId buf, int t, int j) {
    const int64_t so = blk_off(n, K, t), sl = blk_len(n, K, t);
    return Region{buf, so + blk_off(sl, L, j), blk_len(sl, L, j)};
  };
  const int64_t max_block = blk_len(blk_len(n, K, 0), L, 0);  // segment 0, block 0: the largest
  const int64_t x_base = (L - 1) * max_block;                 // scratch: [rs slots][x slots]
  Schedule s;
  s.scratch_count = (L - 1 + H - 1) * max_block;
  auto chain = [](Region dst, const std::vector<Region>& srcs, int own) {
    Schedule tmp;
    append_ordered_reduce(tmp, dst, srcs, own);
    return tmp.steps;
  };
  auto rs_comm = [&](int t, Step& x) {
    for (int j = 0, slot = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, block(BufferId::Input, t, j)));
      x.ops.push_back(op_recv(q, scratch_region(slot++ * max_block, block(BufferId::Input, t, i).count)));
    }
  };
  auto rs_reduce = [&](int t) {
    const Region mine_in = block(BufferId::Input, t, i), mine_out = block(BufferId::Output, t, i);
    if (L == 1) return std::vector<Step>{Step{{op_copy(mine_out, mine_in)}}};
    std::vector<Region> srcs(L);
    for (int j = 0, slot = 0; j < L; ++j)
      srcs[j] = j == i ? mine_in : scratch_region(slot++ * max_block, mine_in.count);
    return chain(mine_out, srcs, i);
  };
  auto x_comm = [&](int t, Step& x) {
    const Region mine = block(BufferId::Output, t, i);
    for (int g = 0, slot = 0; g < H; ++g) {
      if (g == h) continue;
      const int q = m.hosts[g][i];
      x.ops.push_back(op_send(q, mine));
      x.ops.push_back(op_recv(q, scratch_region(x_base + slot++ * max_block, mine.count)));
    }
  };
  auto x_reduce = [&](int t) {
    const Region mine = block(BufferId::Output, t, i);
    std::vector<Region> srcs(H);
    for (int g = 0, slot = 0; g < H; ++g)
      srcs[g] = g == h ? mine : scratch_region(x_base + slot++ * max_block, mine.count);
    return chain(mine, srcs, h);
  };
  auto ag_comm = [&](int t, Step& x) {
    for (int j = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      x.ops.push_back(op_send(q, block(BufferId::Output, t, i)));
      x.ops.push_back(op_recv(q, block(BufferId::Output, t, j)));
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
  const int K = pipeline_segments(a, m);
  if (K > 1) return all_reduce_pipelined(a, m, K);
  const int r = a.rank, h = m.host[r], i = m.local[r], L = m.L(h), H = m.H();
  const int64_t n = a.count;
  int B = 0;
  for (int g = 0; g < H; ++g) B = std::max(B, m.L(g));
  // Local index j of host g owns blocks [j*B/L_g, (j+1)*B/L_g): at least one, contiguous.
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

Schedule all_gather_hierarchical(const CollArgs& a) {
  const HostMap m(a);
  const int P = a.size, r = a.rank, h = m.host[r], L = m.L(h), H = m.H();
  const int64_t n = a.count;
  auto blk = [&](int q) { return out_region(q * n, n); };
  Schedule s;
  // (1) own block into place; own block to one rank per other host; blocks from other hosts.
  Step x{{op_copy(blk(r), in_region(0, n))}};
  // forwards[j]: what local index j sends to its local peers: its own block, then the blocks it
  // received from other hosts, in rank order.
  std::vector<std::vector<int>> forwards(L);
  for (int j = 0; j < L; ++j) forwards[j].push_back(m.hosts[h][j]);
  for (int q = 0; q < P; ++q) {
    if (m.host[q] == h) continue;
    const int target = m.partner(h, m.local[q]);
    forwards[m.local[target]].push_back(q);
    if (target == r) x.ops.push_back(op_recv(q, blk(q)));
  }
  for (int g = 0; g < H; ++g)
    if (g != h) x.ops.push_back(op_send(m.partner(g, m.local[r]), in_region(0, n)));
  s.steps.push_back(std::move(x));
  // (2) forwarding rounds within the host.
  size_t rounds = 0;
  for (const auto& f : forwards) rounds = std::max(rounds, f.size());
  const int i = m.local[r];
  for (size_t t = 0; t < rounds && L > 1; ++t) {
    Step y;
    for (int j = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      if (t < forwards[i].size()) y.ops.push_back(op_send(q, blk(forwards[i][t])));
      if (t < forwards[j].size()) y.ops.push_back(op_recv(q, blk(forwards[j][t])));
    }
    s.steps.push_back(std::move(y));
  }
  return s;
}

Schedule reduce_scatter_hierarchical(const CollArgs& a) {
  const HostMap m(a);
  const int P = a.size, r = a.rank, h = m.host[r], L = m.L(h), H = m.H(), i = m.local[r];
  const int64_t n = a.count;
  auto in_blk = [&](int q) { return in_region(q * n, n); };
  // collects[j]: the blocks local index j reduces for this host: its own, then other hosts' ranks
  // it collects for (rank order). Accumulators of collected blocks follow the receive slots.
  std::vector<std::vector<int>> collects(L);
  for (int j = 0; j < L; ++j) collects[j].push_back(m.hosts[h][j]);
  for (int q = 0; q < P; ++q)
    if (m.host[q] != h) collects[m.local[m.partner(h, m.local[q])]].push_back(q);
  const int64_t slots = std::max(L - 1, H - 1);
  auto slot = [&](int k) { return scratch_region(k * n, n); };
  auto acc = [&](size_t t) { return scratch_region((slots + static_cast<int64_t>(t) - 1) * n, n); };
  Schedule s;
  s.scratch_count = (slots + static_cast<int64_t>(collects[i].size()) - 1) * n;
  size_t rounds = 0;
  for (const auto& c : collects) rounds = std::max(rounds, c.size());
  // (1) one block per round: send my contribution to its collector, reduce what I collect.
  for (size_t t = 0; t < rounds; ++t) {
    Step x;
    for (int j = 0, k = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      if (t < collects[j].size()) x.ops.push_back(op_send(q, in_blk(collects[j][t])));
      if (t < collects[i].size()) x.ops.push_back(op_recv(q, slot(k)));
      ++k;
    }
    if (!x.ops.empty()) s.steps.push_back(std::move(x));
    if (t >= collects[i].size()) continue;
    const Region dst = t == 0 ? out_region(0, n) : acc(t);
    if (L == 1) {
      s.steps.push_back(Step{{op_copy(dst, in_blk(collects[i][t]))}});
      continue;
    }
    std::vector<Region> srcs(L);
    for (int j = 0, k = 0; j < L; ++j) srcs[j] = j == i ? in_blk(collects[i][t]) : slot(k++);
    append_ordered_reduce(s, dst, srcs, i);
  }
  // (2) host partials to their owners; the owner reduces them in host order.
  if (H > 1) {
    Step x;
    for (size_t t = 1; t < collects[i].size(); ++t) x.ops.push_back(op_send(collects[i][t], acc(t)));
    std::vector<Region> srcs(H);
    for (int g = 0, k = 0; g < H; ++g) {
      if (g == h) {
        srcs[g] = out_region(0, n);
        continue;
      }
      srcs[g] = slot(k++);
      x.ops.push_back(op_recv(m.partner(g, i), srcs[g]));
    }
    s.steps.push_back(std::move(x));
    append_ordered_reduce(s, out_region(0, n), srcs, h);
  }
  return s;
}

Schedule broadcast_hierarchical(const CollArgs& a) {
  const HostMap m(a);
  const int r = a.rank, root = a.root, h = m.host[r], hr = m.host[root];
  const Region in = in_region(0, a.count), out = out_region(0, a.count);
  Schedule s;
  if (r == root) {
    Step x{{op_copy(out, in)}};
    for (int g = 0; g < m.H(); ++g)
      if (g != hr) x.ops.push_back(op_send(m.hosts[g][0], in));
    for (int q : m.hosts[h])
      if (q != r) x.ops.push_back(op_send(q, in));
    s.steps.push_back(std::move(x));
    return s;
  }
  const int source = h == hr ? root : m.hosts[h][0];
  if (r != source) {
    s.steps.push_back(Step{{op_recv(source, out)}});
    return s;
  }
  s.steps.push_back(Step{{op_recv(root, out)}});  // a leader of another host
  Step x;
  for (int q : m.hosts[h])
    if (q != r) x.ops.push_back(op_send(q, out));
  if (!x.ops.empty()) s.steps.push_back(std::move(x));
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "hierarchical", all_reduce_hierarchical, 8, kLargeMessages,
                           "reduce-scatter within hosts, all-reduce of each block across hosts, all-gather within hosts");
COMMLIB_REGISTER_ALGORITHM(AllGather, "hierarchical", all_gather_hierarchical, 5, kLargeMessages,
                           "each block crosses to every other host once, then is forwarded within the host");
COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "hierarchical", reduce_scatter_hierarchical, 4, kLargeMessages,
                           "per-host collectors reduce each block, then owners reduce host partials");
COMMLIB_REGISTER_ALGORITHM(Broadcast, "hierarchical", broadcast_hierarchical, 5, kSmallMessages,
                           "root to one rank per host, then within each host");

}  // namespace sched
}  // namespace commlib
