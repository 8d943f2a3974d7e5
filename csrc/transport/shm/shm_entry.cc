// The shm kind's row in the transport table: the ranks of this host, when it holds the region.
#include "transport/shm/shm_entry.h"

#include <stdexcept>

#include "transport/shm/shm.h"

namespace commlib {

namespace {

bool shm_connects(const FabricInputs& in, int peer, std::string* why) {
  if (in.topo.host_of[peer] != in.topo.host_of[in.rank]) return *why = "another host", false;
  if (!in.find<ShmRegion>(kShmKind)) return *why = "same host, no shared-memory region", false;
  return true;
}

// The domain is the host's ranks in rank order, this rank's index its place among them: the
// region was sized and laid out for exactly them (commlib/init.py), on every rank of the host.
Domain shm_create(FabricInputs& in, const std::vector<int>& members) {
  const ShmRegion* region = in.find<ShmRegion>(kShmKind);
  if (!region) throw std::invalid_argument("shm: no shared-memory region for this host");
  if (members != in.topo.ranks_on(in.topo.host_of[in.rank]))
    throw std::invalid_argument("shm: the host's domain does not match the topology");
  Domain d;
  d.index.assign(in.topo.host_of.size(), -1);
  int local_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    d.index[members[i]] = static_cast<int>(i);
    if (members[i] == in.rank) local_rank = static_cast<int>(i);
  }
  const int local_size = static_cast<int>(members.size());
  d.transport = std::make_unique<ShmTransport>(local_rank, local_size, region->fd, shm_config_from_env(local_size));
  return d;
}

// Preferred first; the home domain: a rank sleeps on its doorbell (a one-rank domain when the
// host has no other rank).
const TransportRegistration shm_row({kShmKind, 10, true, shm_connects, shm_create});

}  // namespace

}  // namespace commlib
