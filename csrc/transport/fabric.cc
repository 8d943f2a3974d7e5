#include "transport/fabric.h"

#include <stdexcept>

namespace commlib {

Fabric::Fabric(int rank, int size, Topology topo, std::unique_ptr<ShmTransport> local, std::unique_ptr<TcpTransport> net)
    : rank_(rank), size_(size), topo_(std::move(topo)), local_index_(size, -1), local_(std::move(local)),
      net_(std::move(net)), links_(size) {
  if (static_cast<int>(topo_.host_of.size()) != size) throw std::invalid_argument("topology: one host per rank expected");
  const std::vector<int> mine = topo_.ranks_on(topo_.host_of[rank]);
  for (size_t i = 0; i < mine.size(); ++i) local_index_[mine[i]] = static_cast<int>(i);
  if (!local_ || local_->size() != static_cast<int>(mine.size()) || local_->rank() != local_index_[rank])
    throw std::invalid_argument("shm: the host's domain does not match the topology");
  if (!net_ && topo_.hosts() > 1) throw std::invalid_argument("tcp: ranks on other hosts but no tcp transport");
  if (net_) net_->set_waker(local_.get());
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    if (local_index_[p] >= 0)
      links_[p] = std::make_unique<DomainLink>(*local_, local_index_[p], LinkKind::Shm);
    else
      links_[p] = std::make_unique<DomainLink>(*net_, p, LinkKind::Tcp);
  }
}

Fabric::~Fabric() { close(); }

void Fabric::wait_events(uint32_t seen, int64_t timeout_us) {
  // The TCP spin polls the sockets from this thread (TcpTransport::spin_until); it returns early
  // once this rank's doorbell moved (a delivery from either domain).
  if (net_ && net_->spin_until(*local_, seen)) return;
  local_->wait_events(seen, timeout_us);
}

PeerStatus Fabric::peer_status(int peer, bool check_process) {
  return local_index_[peer] >= 0 ? local_->peer_status(local_index_[peer], check_process)
                                 : net_->peer_status(peer, check_process);
}

bool Fabric::peer_call(int peer, CallDesc* d) {
  return local_index_[peer] >= 0 ? local_->peer_call(local_index_[peer], d) : net_->peer_call(peer, d);
}

int Fabric::peer_pid(int peer) {
  return local_index_[peer] >= 0 ? local_->peer_pid(local_index_[peer]) : net_->peer_pid(peer);
}

std::string Fabric::describe_peer(int peer) {
  const bool here = local_index_[peer] >= 0;
  const int pid = here ? local_->peer_pid(local_index_[peer]) : net_->peer_pid(peer);
  std::string s = "rank " + std::to_string(peer) + " (pid " + std::to_string(pid);
  if (!here) s += " on host " + topo_.host_names[topo_.host_of[peer]];
  return s + ")";
}

void Fabric::publish_failure(ErrorKind kind, const std::string& message) {
  local_->publish_failure(kind, message);
  if (net_) net_->publish_failure(kind, message);
}

void Fabric::publish_call(const CallDesc& d) {
  local_->publish_call(d);
  if (net_) net_->publish_call(d);
}

void Fabric::close() {
  if (closed_) return;
  closed_ = true;
  if (net_) net_->close();
  local_->close();
}

}  // namespace commlib
