// The transport table: NCCL's shape for choosing how two ranks talk. An ordered list of
// transports, each saying whether it can connect this rank to a peer and building its domain (the
// ranks it reaches, one Transport); for every peer the first entry that can connect the pair
// carries it: shm for a rank on the same host, tcp for the others. The Fabric (fabric.h) asks the
// table per peer and keeps, per peer, the domain and link that won.
//
// The bootstrap stays apart from the data plane: it only hands over what it gathered (this host's
// shared-memory region, a listening TCP endpoint, the host map); nothing here talks to the store.
#pragma once

#include <memory>
#include <vector>

#include "common/topology.h"
#include "transport/link.h"
#include "transport/tcp.h"

namespace commlib {

// What a rank knows when its transports are chosen: where every rank is, and what the bootstrap
// gave it to build domains from.
struct Reach {
  int rank = 0;
  Topology topo;
  bool host_region = false;  // it holds its host's shared-memory region
  std::vector<bool> net;     // by rank: its listening TCP endpoint reaches that rank (empty: none)
};

// The material itself, consumed by the entries' create().
struct FabricInputs {
  Reach reach;
  int host_region_fd = -1;             // this host's region (a memfd; the shm domain maps it)
  std::unique_ptr<TcpTransport> net;   // the listening endpoint (the tcp domain takes it)
};

struct TransportEntry;

// A built domain: its transport, and by global rank each member's index in it (-1: not a member).
struct Domain {
  const TransportEntry* entry = nullptr;
  std::unique_ptr<Transport> transport;
  std::vector<int> index;
  // The same transport, typed, when this is the tcp domain (set by its create()): what the
  // bindings' connect and tcp_stats reach through Fabric::tcp(); null for every other domain.
  TcpTransport* tcp = nullptr;
};

struct TransportEntry {
  const char* name;
  LinkKind kind;
  // The domain this rank sleeps on (one entry has it): built even when it wins no peer (then a
  // one-rank domain), and every other domain rings its event counter on delivery.
  bool home;
  bool (*can_connect)(const Reach& r, int peer);
  // Builds the domain over `members` (global ranks, ascending, this rank among them).
  Domain (*create)(FabricInputs& in, const std::vector<int>& members);
};

// The table, in order of preference.
const std::vector<TransportEntry>& transport_table();
// By rank: the entry that carries the pair (this rank, peer), nullptr for this rank itself.
// std::invalid_argument naming the pair when no entry can connect it.
std::vector<const TransportEntry*> choose_transports(const Reach& r);

}  // namespace commlib
