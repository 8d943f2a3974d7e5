// The cost model placed on a call's host map (candidate_search.h, placed_model).
#include <algorithm>
#include <vector>

#include "policy/candidate_search.h"
#include "sim/topology.h"

namespace commlib {

sim::Topology placed_model(const sim::Topology& model, const std::vector<int>& host_of) {
  sim::Topology t = model;
  // The NIC of each local index as the model's own first host has it: which local ranks share a NIC
  // is the topology's (`nic_of`: the presets' i % nics, commlib/sim/topology_model.py, or any other
  // map), so the search plays the NIC map the simulator then plays. Local indices past that host's
  // ranks take NIC i % nics. (Before session 26 every placement took i % nics whatever nic_of said:
  // docs/simulator.md "NIC-shared hosts".)
  std::vector<int> nic_of_local;
  for (size_t r = 0; r < model.host_of.size() && r < model.nic_of.size(); ++r)
    if (model.host_of[r] == model.host_of[0]) nic_of_local.push_back(model.nic_of[r]);
  std::vector<int> ids, count;
  t.host_of.assign(host_of.size(), 0);
  t.nic_of.assign(host_of.size(), 0);
  for (size_t r = 0; r < host_of.size(); ++r) {
    size_t h = 0;
    while (h < ids.size() && ids[h] != host_of[r]) ++h;
    if (h == ids.size()) {
      ids.push_back(host_of[r]);
      count.push_back(0);
    }
    t.host_of[r] = static_cast<int>(h);
    const int i = count[h]++;
    t.nic_of[r] = i < static_cast<int>(nic_of_local.size()) ? nic_of_local[i] : i % std::max(1, t.nics_per_host);
  }
  return t;
}

}  // namespace commlib
