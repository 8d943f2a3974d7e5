#include "common/topology.h"

namespace commlib {

std::vector<int> Topology::ranks_on(int host) const {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r)
    if (host_of[r] == host) out.push_back(r);
  return out;
}

}  // namespace commlib
