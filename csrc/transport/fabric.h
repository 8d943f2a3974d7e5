// What the executor talks to: one Link per peer, and a control plane that routes each question
// about a peer to the domain that reaches it, while publishing this rank's own state (call,
// failure, close) to every domain. Which domain reaches which peer is the transport table's choice
// (registry.h: the first entry that can connect the pair; shm on the same host, tcp otherwise);
// the Fabric names no kind of transport.
//
// A rank always sleeps on the home domain's event counter (the table's home entry, shm; a host
// with one rank has a one-rank shm domain): the other domains ring it too (tcp's progress thread),
// so one wait covers every link; before it sleeps, the other domains may make progress from the
// waiting thread (tcp polls its sockets for the spin time).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/topology.h"
#include "transport/link.h"
#include "transport/registry.h"

namespace commlib {

class Fabric {
 public:
  // Builds the domains the table chooses for this rank's peers from what the bootstrap gathered.
  explicit Fabric(FabricInputs in);
  ~Fabric();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Topology& topology() const { return topo_; }
  Link& link(int peer) { return *links_[peer]; }
  // The kind of transport that carries each peer ("shm", "tcp"; "self" for this rank).
  const char* transport_name(int peer) const;
  // The domain of one kind (null when that kind carries no peer of this rank): what a layer that
  // knows the kind (the bindings' tcp connect and stats) casts to the kind's own class.
  Transport* domain(const std::string& kind);

  uint32_t events() { return home_->events(); }
  // Lets every other domain make progress from this thread for its spin time (tcp), so a small
  // message is read by the rank that waits for it, not handed over by a progress thread; then
  // sleeps on the home domain's counter. `spin` false: straight to the sleep. Returns whether a
  // spin saw the counter move (false: it slept, or no domain spins).
  bool wait_events(uint32_t seen, int64_t timeout_us, bool spin = true);

  PeerStatus peer_status(int peer, bool check_process);
  bool peer_failed(int peer);  // Transport::peer_failed
  bool peer_call(int peer, CallDesc* d);
  std::string describe_peer(int peer);  // "rank 3 (pid 123)" or "rank 3 (pid 123 on host b)"
  int peer_pid(int peer);
  void publish_failure(ErrorKind kind, const std::string& message);
  void publish_call(const CallDesc& d);
  // Single-copy reads where a domain allows them; the links' capabilities are queried again.
  bool enable_direct_reads();
  // The domains' reasons for having direct reads off, joined ("" when every domain reads directly).
  std::string direct_reads_reason() const;
  // The home domain's shared-memory flag calls when it holds every rank of the communicator,
  // numbered as the communicator numbers them (null otherwise: ranks on other hosts).
  SharedFlags* shared_flags() { return flags_; }
  void close();

 private:
  Domain& domain_of(int peer) { return domains_[domain_of_[peer]]; }

  int rank_, size_;
  Topology topo_;
  std::vector<Domain> domains_;   // in table order
  std::vector<int> domain_of_;    // by global rank: index in domains_ (-1: this rank)
  Transport* home_ = nullptr;
  std::vector<Transport*> spinners_;  // the domains other than home, asked to spin before a sleep
  std::vector<std::unique_ptr<Link>> links_;
  SharedFlags* flags_ = nullptr;  // shared_flags()
  bool closed_ = false;
};

}  // namespace commlib
