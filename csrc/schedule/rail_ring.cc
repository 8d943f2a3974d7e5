// Multi-channel rail-aligned rings (NCCL's multi-node ring): the buffer is cut into C channels, each
// a share of every block with its own ring order through all P ranks, and the C rings run side by
// side, each channel in a lane of its own (schedule/lanes.h, issue #39: a channel's step waits only
// for its own previous step, so on the host executor a channel held up by a slow link holds back no
// other), so every NIC and every intra-host port carries a share at once instead of one NIC per host
// boundary. The channels are listed round by round (channel_lanes): run in list order (the device
// plans, compressed calls) every rank runs ring step k of channel 0, then of channel 1, ..., each a
// whole exchange of its ring.
//
// Channel orders (rail_orders): with H >= 2 hosts of equal, even size L (the DGX shape), C = L and
// the ring of channel c visits the hosts in order, crossing the ranks of host h along a Hamiltonian
// path that starts at local index s = c + h*L/2 (mod L) and ends at s + L/2, so it leaves host h
// from the local index it enters host h+1 at: local rank i talks to local rank i of the next host
// (one rail), and every local rank is the one crossing hosts for exactly one channel (it enters for
// exactly one too). The L paths of a host are Walecki's decomposition of the complete graph on L
// vertices into L/2 Hamiltonian paths, each taken forwards and backwards, so no two channels use
// the same intra-host pair in the same direction: each rank sends to and receives from C distinct
// peers per round (one channel on each). With H odd the wrap from the last host back to host 0
// crosses rails (from local index c + L/2 to c), through the spine of a rail-optimised fabric.
// Any other host map (one host, uneven hosts, odd L): C = 2, a ring and the same ring reversed
// (host-major order), or C = 1 when P <= 2.
//
// Each channel is the single ring of its collective (all_reduce_ring.cc, all_gather.cc,
// reduce_scatter.cc) over its order: channel c moves blk(n, C, c) of each block.
#include <vector>

#include "schedule/builders.h"
#include "schedule/hierarchical_hosts.h"
#include "schedule/lanes.h"
#include "schedule/registry.h"
#include "schedule/side_by_side.h"
#include "schedule/subgroup.h"

namespace commlib {
namespace sched {

namespace {

// Walecki's path of L (even) vertices starting at s: i, i+1, i-1, i+2, i-2, ..., i+L/2 for s = i <
// L/2, and that path reversed for s = i + L/2.
std::vector<int> walecki_path(int L, int s) {
  const int half = L / 2, i = s % half;
  std::vector<int> p(L);
  p[0] = i;
  for (int k = 1; 2 * k - 1 < L; ++k) {
    p[2 * k - 1] = pmod(i + k, L);
    if (2 * k < L) p[2 * k] = pmod(i - k, L);
  }
  if (s >= half) std::reverse(p.begin(), p.end());
  return p;
}

// The ring order (ranks in ring sequence) of every channel.
std::vector<std::vector<int>> rail_orders(const CollArgs& a) {
  const HostMap m(a);
  const int H = m.H(), L = m.L(0), P = a.size;
  bool uniform = H >= 2 && L % 2 == 0;
  for (int h = 1; h < H && uniform; ++h) uniform = m.L(h) == L;
  std::vector<std::vector<int>> orders;
  if (uniform) {
    orders.assign(L, {});
    for (int c = 0; c < L; ++c) {
      orders[c].reserve(P);
      for (int h = 0; h < H; ++h)
        for (int i : walecki_path(L, pmod(c + h * (L / 2), L))) orders[c].push_back(m.hosts[h][i]);
    }
    return orders;
  }
  std::vector<int> ring;
  ring.reserve(P);
  for (const auto& g : m.hosts) ring.insert(ring.end(), g.begin(), g.end());
  orders.push_back(ring);
  if (P > 2) orders.emplace_back(ring.rbegin(), ring.rend());
  return orders;
}

// One lane per channel (schedule/lanes.h): the host map alone decides C.
int rail_ring_lanes(const CollArgs& a) { return static_cast<int>(rail_orders(a).size()); }

// The channels' step lists as lanes, channel c in lane c, listed round by round (side_by_side.h
// interleave_rounds): run in list order, every rank runs ring step k of channel 0, then of channel 1,
// and so on, each a whole exchange of its ring, as the channels' one merged step k did.
std::vector<Step> channel_lanes(std::vector<std::vector<Step>> lists) {
  for (size_t c = 0; c < lists.size(); ++c)
    for (Step& st : lists[c]) st.lane = static_cast<int>(c);
  return interleave_rounds(std::move(lists));
}

int position(const std::vector<int>& order, int r) {
  return static_cast<int>(std::find(order.begin(), order.end(), r) - order.begin());
}

Schedule all_reduce_rail_ring(const CollArgs& a) {
  const std::vector<std::vector<int>> orders = rail_orders(a);
  const int C = static_cast<int>(orders.size());
  std::vector<std::vector<Step>> lists;
  for (int c = 0; c < C; ++c) {
    const int64_t off = blk_off(a.count, C, c), len = blk_len(a.count, C, c);
    const Subgroup g{orders[c], {BufferId::Input, off}, {BufferId::Output, off}, {BufferId::Scratch, 0}};
    lists.push_back(on_subgroup(Collective::AllReduce, "ring", a.rank, len, 0, g).steps);
  }
  Schedule s;
  s.steps = channel_lanes(std::move(lists));
  return s;
}

// all_gather: output block j = rank j's input; channel c forwards elements [off, off+len) of each
// block around its ring (the all_gather ring of all_gather.cc on positions).
Schedule all_gather_rail_ring(const CollArgs& a) {
  const std::vector<std::vector<int>> orders = rail_orders(a);
  const int C = static_cast<int>(orders.size()), P = a.size, r = a.rank;
  const int64_t n = a.count;
  std::vector<std::vector<Step>> lists(C);
  for (int c = 0; c < C; ++c) {
    const std::vector<int>& ord = orders[c];
    const int64_t off = blk_off(n, C, c), len = blk_len(n, C, c);
    const int i = position(ord, r), next = ord[(i + 1) % P], prev = ord[(i + P - 1) % P];
    auto blk = [&](int pos) { return out_region(ord[pmod(pos, P)] * n + off, len); };
    std::vector<Step>& st = lists[c];
    for (int k = 0; k < P - 1; ++k)
      st.push_back(Step{{op_send(next, k == 0 ? in_region(off, len) : blk(i - k)), op_recv(prev, blk(i - k - 1))}});
  }
  for (int c = 0; c < C; ++c) {  // each channel copies its own share of this rank's block (its lane's elements)
    if (lists[c].empty()) lists[c].emplace_back();
    lists[c][0].ops.push_back(op_copy(out_region(r * n + blk_off(n, C, c), blk_len(n, C, c)),
                                      in_region(blk_off(n, C, c), blk_len(n, C, c))));
  }
  Schedule s;
  s.steps = channel_lanes(std::move(lists));
  return s;
}

// reduce_scatter: rank r ends with block r reduced; channel c reduces elements [off, off+len) of
// every block around its ring (reduce_scatter.cc's ring on positions), its two scratch buffers at
// [2*off, 2*off + 2*len).
Schedule reduce_scatter_rail_ring(const CollArgs& a) {
  const std::vector<std::vector<int>> orders = rail_orders(a);
  const int C = static_cast<int>(orders.size()), P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
    return s;
  }
  std::vector<std::vector<Step>> lists(C);
  for (int c = 0; c < C; ++c) {
    const std::vector<int>& ord = orders[c];
    const int64_t off = blk_off(n, C, c), len = blk_len(n, C, c);
    const int i = position(ord, r), next = ord[(i + 1) % P], prev = ord[(i + P - 1) % P];
    auto in = [&](int pos) { return in_region(ord[pmod(pos, P)] * n + off, len); };
    const Region out = out_region(off, len);
    const Region buf[2] = {scratch_region(2 * off, len), scratch_region(2 * off + len, len)};
    std::vector<Step>& st = lists[c];
    // Each ring step is one message step whose partial is reduced with the rank's own block as it
    // arrives (recv_reduce from the input), as in reduce_scatter.cc; every channel has the same
    // step structure, so zipping keeps the channels' steps in line.
    for (int k = 0; k < P - 1; ++k) {
      const Region src = k == 0 ? in(i - 1) : buf[(k - 1) % 2];
      const Region dst = k == P - 2 ? out : buf[k % 2];
      st.push_back(Step{{op_send(next, src), op_recv_reduce_from(prev, dst, in(i - k - 2))}});
    }
  }
  s.steps = channel_lanes(std::move(lists));
  if (P > 2) s.scratch_count = 2 * n;
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllReduce, "rail_ring", all_reduce_rail_ring, 9, kLargeMessages,
                           "one ring per rail: channels whose rings cross hosts on every local rank's NIC");
COMMLIB_REGISTER_ALGORITHM(AllGather, "rail_ring", all_gather_rail_ring, 6, kLargeMessages,
                           "one ring per rail: channels whose rings cross hosts on every local rank's NIC");
COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "rail_ring", reduce_scatter_rail_ring, 5, kLargeMessages,
                           "one ring per rail: channels whose rings cross hosts on every local rank's NIC");

static const LanesRegistrar all_reduce_lanes(Collective::AllReduce, "rail_ring", rail_ring_lanes);
static const LanesRegistrar all_gather_lanes(Collective::AllGather, "rail_ring", rail_ring_lanes);
static const LanesRegistrar reduce_scatter_lanes(Collective::ReduceScatter, "rail_ring", rail_ring_lanes);

}  // namespace sched
}  // namespace commlib
