// The host map the hierarchical schedules share (hierarchical.cc, hierarchical_all_reduce.cc):
// built from CollArgs::host_of, internal to csrc/schedule.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "schedule/ir.h"

namespace commlib {
namespace sched {

// Hosts in order of their lowest rank, each with its ranks ascending.
struct HostMap {
  std::vector<std::vector<int>> hosts;
  std::vector<int> host, local;  // by rank
  explicit HostMap(const CollArgs& a) : host(a.size), local(a.size) {
    if (!a.host_of.empty() && static_cast<int>(a.host_of.size()) != a.size)
      throw std::invalid_argument("host_of: " + std::to_string(a.host_of.size()) + " entries for " +
                                  std::to_string(a.size) + " ranks");
    // Host ids to dense indices by hash: a linear search over the hosts seen was O(P x H) per
    // rank's build, 43 % of simulating 4096 ranks on 512 hosts (every rank builds its map).
    std::unordered_map<int, int> index_of;
    index_of.reserve(64);
    for (int r = 0, h = -1, last_id = 0; r < a.size; ++r) {
      const int id = a.host_of.empty() ? 0 : a.host_of[r];
      if (h < 0 || id != last_id) {  // neighbours mostly share a host: look up only on a change
        const auto [it, fresh] = index_of.emplace(id, static_cast<int>(hosts.size()));
        if (fresh) hosts.emplace_back();
        h = it->second, last_id = id;
      }
      host[r] = h;
      local[r] = static_cast<int>(hosts[h].size());
      hosts[h].push_back(r);
    }
  }
  int H() const { return static_cast<int>(hosts.size()); }
  int L(int h) const { return static_cast<int>(hosts[h].size()); }
  int max_L() const {
    int b = 0;
    for (const auto& g : hosts) b = std::max(b, static_cast<int>(g.size()));
    return b;
  }
  // The rank of host h that handles what local index i of another host sends.
  int partner(int h, int i) const { return hosts[h][i % L(h)]; }
};

// Forwarding rounds within the host (all_gather, built-in and composed): local index j sends
// forwards[j][t] (an output block of n elements) to every local peer in round t.
void append_forwarding(Schedule& s, const HostMap& m, int r, int64_t n, const std::vector<std::vector<int>>& forwards);

// The schedules composed with CollArgs::inter_algorithm (hierarchical_composed.cc; all_reduce
// composes in hierarchical_all_reduce.cc).
Schedule all_gather_composed(const CollArgs& a, const HostMap& m);
Schedule reduce_scatter_composed(const CollArgs& a, const HostMap& m);
Schedule broadcast_composed(const CollArgs& a, const HostMap& m);

}  // namespace sched
}  // namespace commlib
