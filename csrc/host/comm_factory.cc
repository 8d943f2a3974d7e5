// The host communicator's stack (host/comm_factory.h).
#include "host/comm_factory.h"

#include <stdexcept>
#include <utility>

#include "common/topology.h"
#include "transport/fabric.h"
#include "transport/shm/shm_entry.h"
#include "transport/tcp/tcp_entry.h"

namespace commlib {

namespace {

void check_rank(int rank, int size) {
  if (size < 1) throw std::invalid_argument("world_size: must be at least 1");
  if (rank < 0 || rank >= size) throw std::invalid_argument("rank: out of range for world_size");
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(CommSpec spec, std::unique_ptr<TcpTransport>& net) {
  check_rank(spec.rank, spec.size);
  Topology topo;
  topo.host_of = std::move(spec.host_of);
  topo.host_names = std::move(spec.host_names);
  if (static_cast<int>(topo.host_of.size()) != spec.size) throw std::invalid_argument("host_of: one entry per rank");
  for (int h : topo.host_of)
    if (h < 0 || h >= topo.hosts()) throw std::invalid_argument("host_of: host index out of range");
  FabricInputs in;
  in.material[kShmKind] = std::make_unique<ShmRegion>(spec.fd);
  if (topo.hosts() > 1) {  // else the endpoint stays with the caller, unused
    if (!net) throw std::invalid_argument("tcp: ranks on other hosts need a TcpEndpoint");
    in.material[kTcpKind] = std::make_unique<TcpEndpointMaterial>(std::move(net));
  }
  in.rank = spec.rank;
  in.topo = std::move(topo);
  auto fabric = std::make_unique<Fabric>(std::move(in));
  return std::make_unique<Communicator>(std::move(fabric), CommOptions{spec.timeout, spec.debug, spec.label});
}

std::unique_ptr<Communicator> make_local_communicator(int rank, int size, int fd, double timeout,
                                                      const std::string& label, int debug) {
  check_rank(rank, size);
  Topology topo;
  topo.host_of.assign(size, 0);
  topo.host_names = {"localhost"};
  FabricInputs in;
  in.rank = rank;
  in.topo = std::move(topo);
  in.material[kShmKind] = std::make_unique<ShmRegion>(fd);
  auto fabric = std::make_unique<Fabric>(std::move(in));
  return std::make_unique<Communicator>(std::move(fabric), CommOptions{timeout, debug, label});
}

}  // namespace commlib
