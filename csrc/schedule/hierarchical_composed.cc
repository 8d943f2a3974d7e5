// Hierarchical schedules composed with any registered algorithm for the inter-host phase
// (CollArgs::inter_algorithm non-empty; the built-in direct exchange is hierarchical.cc). all_reduce
// composes beside its built-in schedule in hierarchical_all_reduce.cc, sharing its segment layout.
// The inter-host phase is the sub-group combinator (subgroup.h) over one rank per host; the
// intra-host phases are direct exchanges, as in the built-in schedules, or with
// CollArgs::intra_algorithm set, that registered algorithm on the host's ranks (below: the
// all_gather forwarding is an all_gather, the reduce_scatter collection a reduce_scatter, the
// broadcast within the host a broadcast). A host's ranks forward or collect different numbers of
// blocks on uneven hosts; the registered collectives move equal ones, so each rank packs its
// blocks into the host's largest count of slots (the rest filled from the input, its result
// dropped) and unpacks after.
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
#include <stdexcept>
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

Subgroup host_group(const HostMap& m, int h, int64_t base, int64_t slots_elems) {
  Subgroup g;
  g.members = m.hosts[h];
  g.input = Rebase{BufferId::Scratch, base};
  g.output = Rebase{BufferId::Scratch, base + slots_elems};
  g.scratch = Rebase{BufferId::Scratch, base + slots_elems + static_cast<int64_t>(m.L(h)) * slots_elems};
  return g;
}

// The forwarding rounds as an all_gather with `algo` (CollArgs::intra_algorithm) over the host:
// local index j's blocks forwards[j] packed into F = max |forwards| slots of n elements, at
// scratch `base`.
void append_intra_forwarding(Schedule& s, const HostMap& m, int r, int64_t n,
                             const std::vector<std::vector<int>>& forwards, const std::string& algo, int64_t base) {
  const int h = m.host[r], i = m.local[r], L = m.L(h);
  size_t F = 0;
  for (const auto& f : forwards) F = std::max(F, f.size());
  if (L == 1 || n == 0) return;
  const int64_t slots = static_cast<int64_t>(F) * n;
  Step pack;
  for (size_t t = 0; t < F; ++t)
    pack.ops.push_back(op_copy(scratch_region(base + t * n, n),
                               t < forwards[i].size() ? out_region(forwards[i][t] * n, n) : in_region(0, n)));
  s.steps.push_back(std::move(pack));
  append_schedule(s, on_subgroup(Collective::AllGather, algo, r, slots, 0, host_group(m, h, base, slots), "intra_algorithm"));
  Step unpack;
  for (int j = 0; j < L; ++j)
    for (size_t t = 0; j != i && t < forwards[j].size(); ++t)
      unpack.ops.push_back(op_copy(out_region(forwards[j][t] * n, n), scratch_region(base + slots + (j * F + t) * n, n)));
  s.steps.push_back(std::move(unpack));
  s.scratch_count = std::max(s.scratch_count, base + (1 + L) * slots);
}

void check_intra(const CollArgs& a) {
  if (!a.intra_algorithm.empty() && a.inter_algorithm.empty())
    throw std::invalid_argument("intra_algorithm: '" + a.intra_algorithm + "' needs an inter_algorithm too");
}

}  // namespace

Schedule all_gather_composed(const CollArgs& a, const HostMap& m) {
  check_intra(a);
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
  if (a.intra_algorithm.empty()) append_forwarding(s, m, r, n, forwards);
  else append_intra_forwarding(s, m, r, n, forwards, a.intra_algorithm, s.scratch_count);
  return s;
}

Schedule reduce_scatter_composed(const CollArgs& a, const HostMap& m) {
  check_intra(a);
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
  if (!a.intra_algorithm.empty() && L > 1 && n > 0) {
    // (1) as a reduce_scatter with intra_algorithm: slot jl of the packed input holds the blocks
    // local index jl collects (padded to `rounds` blocks); this rank's result unpacks into acc.
    const int64_t slots = static_cast<int64_t>(rounds) * n, base = sub_base;
    Step pack;
    for (int jl = 0; jl < L; ++jl)
      for (size_t t = 0; t < rounds; ++t)
        pack.ops.push_back(op_copy(scratch_region(base + jl * slots + t * n, n),
                                   in_region(t < collects[jl].size() ? collects[jl][t].block * n : 0, n)));
    s.steps.push_back(std::move(pack));
    append_schedule(s, on_subgroup(Collective::ReduceScatter, a.intra_algorithm, r, slots, 0,
                                   host_group(m, h, base, L * slots), "intra_algorithm"));
    Step unpack;
    for (size_t t = 0; t < collects[i].size(); ++t)
      unpack.ops.push_back(op_copy(acc(collects[i][t].k, collects[i][t].g), scratch_region(base + L * slots + t * n, n)));
    s.steps.push_back(std::move(unpack));
    s.scratch_count = std::max(s.scratch_count, base + (L + 1) * slots);
    rounds = 0;  // the direct rounds below are done
  }
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
  check_intra(a);
  const int r = a.rank, root = a.root, h = m.host[r], hr = m.host[root];
  const int64_t n = a.count;
  auto leader = [&](int g) { return g == hr ? root : m.hosts[g][0]; };
  // Within the host with intra_algorithm: a broadcast from the leader's output, in place.
  auto within = [&](Schedule& s) {
    Subgroup local;
    local.members = m.hosts[h];
    local.input = local.output = Rebase{BufferId::Output, 0};
    local.scratch = Rebase{BufferId::Scratch, 0};
    append_schedule(s, on_subgroup(Collective::Broadcast, a.intra_algorithm, r, n, m.local[leader(h)], local,
                                   "intra_algorithm"));
  };
  Schedule s;
  if (!a.intra_algorithm.empty() && r != leader(h)) {
    within(s);
    return s;
  }
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
  if (!a.intra_algorithm.empty()) {
    within(s);
    return s;
  }
  Step x;
  for (int q : m.hosts[h])
    if (q != r) x.ops.push_back(op_send(q, out_region(0, n)));
  if (!x.ops.empty()) s.steps.push_back(std::move(x));
  return s;
}

}  // namespace sched
}  // namespace commlib
