// The transport table: NCCL's shape for choosing how two ranks talk. Each kind of transport lives
// in its own folder (transport/shm/, transport/tcp/) and adds one entry to this table, saying
// whether it can connect this rank to a peer and building its domain (the ranks it reaches, one
// Transport); for every peer the first entry, in order of preference, that can connect the pair
// carries it: shm for a rank on the same host, tcp for the others. The Fabric (fabric.h) asks the
// table per peer and keeps, per peer, the domain and link that won. Nothing at this level names a
// concrete transport: a new kind is a folder with one TransportRegistration in it, and neither the
// table, the Fabric nor the executor changes (tests/transport/test_toy_transport.py shows it).
//
// The bootstrap stays apart from the data plane: it only hands over what it gathered (this host's
// shared-memory region, a listening TCP endpoint), each under its kind's name; nothing here talks
// to the store.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/topology.h"
#include "transport/link.h"

namespace commlib {

// What the bootstrap gathered for one kind (shm: this host's region; tcp: a listening endpoint).
// The table never looks inside: only the kind's own can_connect and create read it.
struct TransportMaterial {
  virtual ~TransportMaterial() = default;
};

// What a rank knows when its transports are chosen: where every rank is, and by kind name what
// the bootstrap gave it to build domains from (a kind without material connects no pair).
struct FabricInputs {
  int rank = 0;
  Topology topo;
  std::map<std::string, std::unique_ptr<TransportMaterial>> material;

  // The material handed over for `kind`, as that kind's own type (null when none was).
  template <class T>
  T* find(const std::string& kind) const {
    auto it = material.find(kind);
    return it == material.end() ? nullptr : dynamic_cast<T*>(it->second.get());
  }
};

struct TransportEntry;

// A built domain: its transport, and by global rank each member's index in it (-1: not a member).
struct Domain {
  const TransportEntry* entry = nullptr;
  std::unique_ptr<Transport> transport;
  std::vector<int> index;
};

struct TransportEntry {
  std::string name;  // the kind, as the communicator reports its links ("shm", "tcp")
  int preference;    // the table's order: lower is asked first
  // Whether its domain can be the one this rank sleeps on (every other domain rings that one's
  // event counter on delivery): the Fabric makes the first such entry that carries a peer of this
  // rank home, or, when none does, the first such entry over this rank alone (a one-rank domain).
  bool home;
  // Whether this kind connects (in.rank, peer); when not, *why says why in a few words (the
  // error names every kind's reason when no kind connects a pair).
  bool (*can_connect)(const FabricInputs& in, int peer, std::string* why);
  // Builds the domain over `members` (global ranks, ascending, this rank among them); it may take
  // its kind's material out of `in`.
  Domain (*create)(FabricInputs& in, const std::vector<int>& members);
};

// Adds a kind to the table (std::invalid_argument on a name already there). A kind's folder
// registers itself at load through a TransportRegistration; a test may register one at run time,
// and withdraw it, before and after the communicators that use it (a withdrawn entry stays in
// memory: domains built from it keep pointing at it).
void register_transport(const TransportEntry& entry);
void unregister_transport(const std::string& name);
struct TransportRegistration {
  explicit TransportRegistration(const TransportEntry& entry) { register_transport(entry); }
};

// The table, in order of preference (entries live as long as the process).
std::vector<const TransportEntry*> transport_table();
// The entry named `name`, or nullptr.
const TransportEntry* find_transport(const std::string& name);
// By rank: the entry that carries the pair (in.rank, peer), nullptr for this rank itself.
// std::invalid_argument naming the pair and every kind's reason when no entry can connect it.
std::vector<const TransportEntry*> choose_transports(const FabricInputs& in);

}  // namespace commlib
