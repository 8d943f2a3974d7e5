// The tcp kind's row in the transport table: every rank the listening endpoint reaches.
#include "transport/tcp/tcp_entry.h"

#include <stdexcept>

namespace commlib {

namespace {

bool tcp_connects(const FabricInputs& in, int peer, std::string* why) {
  const TcpEndpointMaterial* m = in.find<TcpEndpointMaterial>(kTcpKind);
  if (!m) return *why = "ranks on other hosts need a TcpEndpoint", false;
  if (peer >= static_cast<int>(m->reaches.size()) || !m->reaches[peer])
    return *why = "the TcpEndpoint does not reach rank " + std::to_string(peer), false;
  return true;
}

// The endpoint already listens; its indices are global ranks.
Domain tcp_create(FabricInputs& in, const std::vector<int>& members) {
  TcpEndpointMaterial* m = in.find<TcpEndpointMaterial>(kTcpKind);
  if (!m || !m->endpoint) throw std::invalid_argument("tcp: ranks on other hosts need a TcpEndpoint");
  Domain d;
  d.index.assign(in.topo.host_of.size(), -1);
  for (int r : members) d.index[r] = r;
  d.transport = std::move(m->endpoint);
  return d;
}

// After shm: it reaches every rank, so it carries only the pairs shm cannot.
const TransportRegistration tcp_row({kTcpKind, 20, false, tcp_connects, tcp_create});

}  // namespace

}  // namespace commlib
