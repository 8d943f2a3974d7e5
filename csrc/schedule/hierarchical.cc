// Hierarchical (topology-aware) schedules: the host map (CollArgs::host_of) decides who talks to
// whom, so that every byte crosses between hosts as few times as possible and the rest moves over
// fast intra-host links. Hosts may hold different numbers of ranks (2+1+3 works). Below, the
// built-in inter-host phase (a direct exchange); with CollArgs::inter_algorithm set, any registered
// algorithm runs it instead (hierarchical_composed.cc).
//
//   all_reduce      built, composed and registered in hierarchical_all_reduce.cc.
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

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

// Forwarding rounds within the host (declared in hierarchical_hosts.h): local index j sends
// forwards[j][t] (an output block) to every local peer in round t.
void append_forwarding(Schedule& s, const HostMap& m, int r, int64_t n, const std::vector<std::vector<int>>& forwards) {
  const int h = m.host[r], L = m.L(h), i = m.local[r];
  size_t rounds = 0;
  for (const auto& f : forwards) rounds = std::max(rounds, f.size());
  for (size_t t = 0; t < rounds && L > 1; ++t) {
    Step y;
    for (int j = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      if (t < forwards[i].size()) y.ops.push_back(op_send(q, out_region(forwards[i][t] * n, n)));
      if (t < forwards[j].size()) y.ops.push_back(op_recv(q, out_region(forwards[j][t] * n, n)));
    }
    if (!y.ops.empty()) s.steps.push_back(std::move(y));
  }
}

Schedule all_gather_hierarchical(const CollArgs& a) {
  const HostMap m(a);
  if (!a.inter_algorithm.empty() || !a.intra_algorithm.empty()) return all_gather_composed(a, m);
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
  append_forwarding(s, m, r, n, forwards);  // (2) forwarding rounds within the host
  return s;
}

Schedule reduce_scatter_hierarchical(const CollArgs& a) {
  const HostMap m(a);
  if (!a.inter_algorithm.empty() || !a.intra_algorithm.empty()) return reduce_scatter_composed(a, m);
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
  if (!a.inter_algorithm.empty() || !a.intra_algorithm.empty()) return broadcast_composed(a, m);
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

COMMLIB_REGISTER_ALGORITHM(AllGather, "hierarchical", all_gather_hierarchical, 5, kLargeMessages,
                           "each block crosses to every other host once, then is forwarded within the host");
COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "hierarchical", reduce_scatter_hierarchical, 4, kLargeMessages,
                           "per-host collectors reduce each block, then owners reduce host partials");
COMMLIB_REGISTER_ALGORITHM(Broadcast, "hierarchical", broadcast_hierarchical, 5, kSmallMessages,
                           "root to one rank per host, then within each host");

}  // namespace sched
}  // namespace commlib
