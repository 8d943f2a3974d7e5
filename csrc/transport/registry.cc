// The transport table (transport/registry.h): shm within a host, tcp across hosts.
#include "transport/registry.h"

#include <stdexcept>
#include <string>

#include "transport/shm.h"

namespace commlib {

namespace {

bool same_host(const Reach& r, int peer) { return r.topo.host_of[peer] == r.topo.host_of[r.rank]; }

bool shm_connects(const Reach& r, int peer) { return r.host_region && same_host(r, peer); }

// The domain is the host's ranks in rank order, this rank's index its place among them: the
// region was sized and laid out for exactly them (commlib/init.py), on every rank of the host.
Domain shm_create(FabricInputs& in, const std::vector<int>& members) {
  if (members != in.reach.topo.ranks_on(in.reach.topo.host_of[in.reach.rank]))
    throw std::invalid_argument("shm: the host's domain does not match the topology");
  Domain d;
  d.index.assign(in.reach.topo.host_of.size(), -1);
  int local_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    d.index[members[i]] = static_cast<int>(i);
    if (members[i] == in.reach.rank) local_rank = static_cast<int>(i);
  }
  const int local_size = static_cast<int>(members.size());
  d.transport = std::make_unique<ShmTransport>(local_rank, local_size, in.host_region_fd, shm_config_from_env(local_size));
  return d;
}

bool tcp_connects(const Reach& r, int peer) { return peer < static_cast<int>(r.net.size()) && r.net[peer]; }

// The endpoint already listens (the bootstrap published its address); its indices are global ranks.
Domain tcp_create(FabricInputs& in, const std::vector<int>& members) {
  if (!in.net) throw std::invalid_argument("tcp: ranks on other hosts need a TcpEndpoint");
  Domain d;
  d.index.assign(in.reach.topo.host_of.size(), -1);
  for (int r : members) d.index[r] = r;
  d.tcp = in.net.get();
  d.transport = std::move(in.net);
  return d;
}

}  // namespace

const std::vector<TransportEntry>& transport_table() {
  static const std::vector<TransportEntry> table = {
      {"shm", LinkKind::Shm, true, shm_connects, shm_create},
      {"tcp", LinkKind::Tcp, false, tcp_connects, tcp_create},
  };
  return table;
}

std::vector<const TransportEntry*> choose_transports(const Reach& r) {
  const int size = static_cast<int>(r.topo.host_of.size());
  if (r.rank < 0 || r.rank >= size) throw std::invalid_argument("rank: out of range for the host map");
  std::vector<const TransportEntry*> out(size, nullptr);
  for (int p = 0; p < size; ++p) {
    if (p == r.rank) continue;
    for (const TransportEntry& e : transport_table())
      if (e.can_connect(r, p)) {
        out[p] = &e;
        break;
      }
    if (!out[p])
      throw std::invalid_argument("transport: no transport connects rank " + std::to_string(r.rank) + " to rank " +
                                  std::to_string(p) +
                                  (same_host(r, p) ? " (same host, no shared-memory region)"
                                                   : " (another host: ranks on other hosts need a TcpEndpoint)"));
  }
  return out;
}

}  // namespace commlib
