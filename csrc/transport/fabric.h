// What the executor talks to: one Link per peer and a control plane that routes each question
// about a peer to the transport domain that reaches it (shm for ranks on this host, tcp for the
// others), while publishing this rank's own state (call, failure, close) to every domain.
//
// A rank always sleeps on the shm domain's event counter (a host with one rank has a one-rank
// shm domain): the tcp progress thread rings it too, so one wait covers every link.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/topology.h"
#include "transport/link.h"
#include "transport/shm.h"
#include "transport/tcp.h"

namespace commlib {

class Fabric {
 public:
  // `local` reaches the ranks on this rank's host (its indices follow topo's order of those
  // ranks); `net` (may be null when there is one host) reaches every other rank.
  Fabric(int rank, int size, Topology topo, std::unique_ptr<ShmTransport> local, std::unique_ptr<TcpTransport> net);
  ~Fabric();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Topology& topology() const { return topo_; }
  Link& link(int peer) { return *links_[peer]; }
  LinkKind link_kind(int peer) const { return peer == rank_ ? LinkKind::Self : links_[peer]->kind(); }
  bool multi_host() const { return net_ != nullptr; }
  TcpTransport* tcp() { return net_.get(); }

  uint32_t events() { return local_->events(); }
  // With TCP peers, the wait first polls their sockets from this thread for the spin time, so a
  // small message is read by the rank that waits for it, not handed over by the progress thread.
  void wait_events(uint32_t seen, int64_t timeout_us);

  PeerStatus peer_status(int peer, bool check_process);
  bool peer_call(int peer, CallDesc* d);
  std::string describe_peer(int peer);
  int peer_pid(int peer);  // "rank 3 (pid 123)" or "rank 3 (pid 123 on host b)"
  void publish_failure(ErrorKind kind, const std::string& message);
  void publish_call(const CallDesc& d);
  bool enable_direct_reads() { return local_->enable_direct_reads(); }
  void close();

 private:
  int rank_, size_;
  Topology topo_;
  std::vector<int> local_index_;  // by global rank: index in the shm domain, -1 when remote
  std::unique_ptr<ShmTransport> local_;
  std::unique_ptr<TcpTransport> net_;
  std::vector<std::unique_ptr<Link>> links_;
  bool closed_ = false;
};

}  // namespace commlib
