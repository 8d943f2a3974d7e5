// Hierarchical schedules composed with any registered algorithm for the inter-host phase
// (CollArgs::inter_algorithm non-empty; the built-in direct exchange is hierarchical.cc). all_reduce
// composes beside its built-in schedule in hierarchical_all_reduce.cc, sharing its segment layout.
// The inter-host phase is the sub-group combinator (subgroup.h) over one rank per host; the
// intra-host phases are direct exchanges, as in the built-in schedules.
//
// Slots. B = the most ranks any host holds. Host g serves slot j (0 <= j < B) with its rank of local
// index j mod L_g (HostMap::partner), so every host takes part in every slot's group, smaller hosts
// with one rank in several groups (in slot order on every rank: groups never wait on each other in
// a cycle). A slot j >= L_g has no block of host g: that member contributes a stand-in block whose
// result nobody keeps (all_gather, reduce_scatter), the price of equal counts on uneven hosts.
//
//   all_gather      each slot's group all-gathers its members' blocks into scratch; each rank keeps
//                   the real ones and forwards them (and its own) to its local peers.
//   reduce_scatter  each slot's collector reduces its host's contributions to the group's blocks
//                   (one block per round, local rank order), then the group reduce-scatters them.
//   broadcast       the root and the lowest rank of every other host broadcast with the inter
//                   algorithm, then each of them sends to its local peers.
#include <algorithm>
#include <string>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/subgroup.h"

namespace commlib {
namespace sched {

namespace {

std::vector<int> slot_group(const HostMap& m, int j) {
  std::vector<int> g(m.H());
  for (int x = 0; x < m.H(); ++x) g[x] = m.partner(x, j);
  return g;
}

}  // namespace

Schedule all_gather_composed(const CollArgs& a, const HostMap& m) {
  const int r = a.rank, h = m.host[r], i = m.local[r], L = m.L(h), H = m.H(), B = m.max_L();
  const int64_t n = a.count;
  Schedule s;
  s.steps.push_back(Step{{op_copy(out_region(r * n, n), in_region(0, n))}});
  std::vector<std::vector<int>> forwards(L);  // own block, then the blocks received across hosts
  for (int j = 0; j < L; ++j) forwards[j].push_back(m.hosts[h][j]);
  for (int j = 0; j < B && H > 1; ++j) {
    std::vector<int>& fw = forwards[j % L];
    for (int g = 0; g < H; ++g)
      if (g != h && j < m.L(g)) fw.push_back(m.hosts[g][j]);
    if (j % L != i) continue;
    Subgroup g;
    g.members = slot_group(m, j);
    g.input = Rebase{BufferId::Input, 0};  // a stand-in where this host has no block j
    g.output = Rebase{BufferId::Scratch, 0};
    g.scratch = Rebase{BufferId::Scratch, H * n};
    append_schedule(s, on_subgroup(Collective::AllGather, a.inter_algorithm, r, n, 0, g));
    s.scratch_count = std::max(s.scratch_count, H * n);
    Step keep;
    for (int x = 0; x < H; ++x)
      if (x != h && j < m.L(x)) keep.ops.push_back(op_copy(out_region(m.hosts[x][j] * n, n), scratch_region(x * n, n)));
    if (!keep.ops.empty()) s.steps.push_back(std::move(keep));
  }
  append_forwarding(s, m, r, n, forwards);
  return s;
}

Schedule reduce_scatter_composed(const CollArgs& a, const HostMap& m) {
  const int r = a.rank, h = m.host[r], i = m.local[r], L = m.L(h), H = m.H(), B = m.max_L();
  const int64_t n = a.count;
  // This rank's slots, and per local index what it collects: (slot position k, host g) pairs whose
  // block hosts[g][j] it reduces over the host into its group's input at k*H*n + g*n.
  std::vector<int> my_slots;
  for (int j = i; j < B; j += L) my_slots.push_back(j);
  struct Entry {
    int k, g, block;
  };
  std::vector<std::vector<Entry>> collects(L);
  for (int jl = 0; jl < L; ++jl) {
    int k = 0;
    for (int j = jl; j < B; j += L, ++k)
      for (int g = 0; g < H; ++g)
        if (j < m.L(g)) collects[jl].push_back(Entry{k, g, m.hosts[g][j]});
  }
  const int64_t recv_base = 0, acc_base = (L - 1) * n;
  const int64_t dummy_out = acc_base + static_cast<int64_t>(my_slots.size()) * H * n, sub_base = dummy_out + n;
  auto acc = [&](int k, int g) { return scratch_region(acc_base + (static_cast<int64_t>(k) * H + g) * n, n); };
  Schedule s;
  s.scratch_count = sub_base;
  {  // stand-ins for slots a host has no rank of (their results are dropped)
    Step fill;
    for (size_t k = 0; k < my_slots.size(); ++k)
      for (int g = 0; g < H; ++g)
        if (my_slots[k] >= m.L(g)) fill.ops.push_back(op_copy(acc(static_cast<int>(k), g), in_region(0, n)));
    if (!fill.ops.empty()) s.steps.push_back(std::move(fill));
  }
  size_t rounds = 0;
  for (const auto& c : collects) rounds = std::max(rounds, c.size());
  for (size_t t = 0; t < rounds; ++t) {  // (1) within the host, one block per round
    Step x;
    for (int j = 0, slot = 0; j < L; ++j) {
      if (j == i) continue;
      const int q = m.hosts[h][j];
      if (t < collects[j].size()) x.ops.push_back(op_send(q, in_region(collects[j][t].block * n, n)));
      if (t < collects[i].size()) x.ops.push_back(op_recv(q, scratch_region(recv_base + slot * n, n)));
      ++slot;
    }
    if (!x.ops.empty()) s.steps.push_back(std::move(x));
    if (t >= collects[i].size()) continue;
    const Entry& e = collects[i][t];
    std::vector<Region> srcs(L);
    for (int j = 0, slot = 0; j < L; ++j) srcs[j] = j == i ? in_region(e.block * n, n) : scratch_region(recv_base + slot++ * n, n);
    if (L == 1) s.steps.push_back(Step{{op_copy(acc(e.k, e.g), srcs[0])}});
    else append_ordered_reduce(s, acc(e.k, e.g), srcs, i);
  }
  for (size_t k = 0; k < my_slots.size(); ++k) {  // (2) each slot's group reduce-scatters
    const int j = my_slots[k];
    Subgroup g;
    g.members = slot_group(m, j);
    g.input = Rebase{BufferId::Scratch, acc_base + static_cast<int64_t>(k) * H * n};
    g.output = j == i ? Rebase{BufferId::Output, 0} : Rebase{BufferId::Scratch, dummy_out};
    g.scratch = Rebase{BufferId::Scratch, sub_base};
    append_schedule(s, on_subgroup(Collective::ReduceScatter, a.inter_algorithm, r, n, 0, g));
  }
  return s;
}

Schedule broadcast_composed(const CollArgs& a, const HostMap& m) {
  const int r = a.rank, root = a.root, h = m.host[r], hr = m.host[root];
  const int64_t n = a.count;
  auto leader = [&](int g) { return g == hr ? root : m.hosts[g][0]; };
  Schedule s;
  if (r != leader(h)) {
    s.steps.push_back(Step{{op_recv(leader(h), out_region(0, n))}});
    return s;
  }
  Subgroup g;
  for (int x = 0; x < m.H(); ++x) g.members.push_back(leader(x));
  g.input = Rebase{BufferId::Input, 0};
  g.output = Rebase{BufferId::Output, 0};
  g.scratch = Rebase{BufferId::Scratch, 0};
  append_schedule(s, on_subgroup(Collective::Broadcast, a.inter_algorithm, r, n, hr, g));
  Step x;
  for (int q : m.hosts[h])
    if (q != r) x.ops.push_back(op_send(q, out_region(0, n)));
  if (!x.ops.empty()) s.steps.push_back(std::move(x));
  return s;
}

}  // namespace sched
}  // namespace commlib
