// Where every rank is, by host: what the transports build (transport/fabric.h) and what the
// policy (policy/auto_policy.h) and the simulator reason about. In common/ so that the verifier
// and the simulator need no transport header to know it.
#pragma once

#include <string>
#include <vector>

namespace commlib {

// Where every rank is: host_of[r] is rank r's host index (0..hosts-1, in order of first rank).
struct Topology {
  std::vector<int> host_of;
  std::vector<std::string> host_names;  // by host index
  int hosts() const { return static_cast<int>(host_names.size()); }
  std::vector<int> ranks_on(int host) const;
};

}  // namespace commlib
