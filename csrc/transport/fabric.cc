#include "transport/fabric.h"

#include <algorithm>
#include <stdexcept>

namespace commlib {

Fabric::Fabric(FabricInputs in)
    : rank_(in.rank),
      size_(static_cast<int>(in.topo.host_of.size())),
      topo_(in.topo),
      domain_of_(size_, -1),
      links_(size_) {
  const std::vector<const TransportEntry*> chosen = choose_transports(in);
  const std::vector<const TransportEntry*> table = transport_table();
  // Home: the first home-capable entry that carries a peer, else the first home-capable one.
  const TransportEntry* home = nullptr;
  for (const TransportEntry* e : table)
    if (e->home && std::find(chosen.begin(), chosen.end(), e) != chosen.end()) {
      home = e;
      break;
    }
  for (const TransportEntry* e : table)
    if (!home && e->home) home = e;
  if (!home) throw std::logic_error("transport table: no entry can be home");
  for (const TransportEntry* e : table) {
    std::vector<int> members;
    for (int p = 0; p < size_; ++p)
      if (chosen[p] == e || p == rank_) members.push_back(p);
    if (members.size() == 1 && e != home) continue;  // carries no peer of this rank
    Domain d = e->create(in, members);
    d.entry = e;
    for (int p : members)
      if (p != rank_) domain_of_[p] = static_cast<int>(domains_.size());
    if (e == home)
      home_ = d.transport.get();
    else if (e->home)  // it would wait on its own counter, which nothing rings for the home
      throw std::logic_error("transport table: " + e->name + " and " + home->name + " both carry peers as home");
    else
      spinners_.push_back(d.transport.get());
    domains_.push_back(std::move(d));
  }
  for (Transport* t : spinners_) t->set_waker(home_);
  // Flag calls need every rank in the home domain, at the communicator's own rank numbers.
  bool all_home = spinners_.empty() && home_->rank() == rank_ && home_->size() == size_;
  for (int p = 0; p < size_ && all_home; ++p)
    all_home = p == rank_ || (domain_of(p).transport.get() == home_ && domain_of(p).index[p] == p);
  if (all_home && size_ > 1) flags_ = home_->shared_flags();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Domain& d = domain_of(p);
    links_[p] = d.transport->make_link(d.index[p]);
    links_[p]->refresh_caps();
  }
}

Fabric::~Fabric() { close(); }

const char* Fabric::transport_name(int peer) const {
  return peer == rank_ ? "self" : domains_[domain_of_[peer]].entry->name.c_str();
}

Transport* Fabric::domain(const std::string& kind) {
  for (Domain& d : domains_)
    if (d.entry->name == kind) return d.transport.get();
  return nullptr;
}

bool Fabric::wait_events(uint32_t seen, int64_t timeout_us, bool spin) {
  // A spinning domain returns early once this rank's doorbell moved (a delivery from any domain).
  if (spin)
    for (Transport* t : spinners_)
      if (t->spin_until(*home_, seen)) return true;
  home_->wait_events(seen, timeout_us);
  return false;
}

PeerStatus Fabric::peer_status(int peer, bool check_process) {
  Domain& d = domain_of(peer);
  return d.transport->peer_status(d.index[peer], check_process);
}

bool Fabric::peer_failed(int peer) {
  Domain& d = domain_of(peer);
  return d.transport->peer_failed(d.index[peer]);
}

bool Fabric::peer_call(int peer, CallDesc* desc) {
  Domain& d = domain_of(peer);
  return d.transport->peer_call(d.index[peer], desc);
}

int Fabric::peer_pid(int peer) {
  Domain& d = domain_of(peer);
  return d.transport->peer_pid(d.index[peer]);
}

std::string Fabric::describe_peer(int peer) {
  std::string s = "rank " + std::to_string(peer) + " (pid " + std::to_string(peer_pid(peer));
  if (topo_.host_of[peer] != topo_.host_of[rank_]) s += " on host " + topo_.host_names[topo_.host_of[peer]];
  return s + ")";
}

void Fabric::publish_failure(ErrorKind kind, const std::string& message) {
  for (Domain& d : domains_) d.transport->publish_failure(kind, message);
}

void Fabric::publish_call(const CallDesc& desc) {
  for (Domain& d : domains_) d.transport->publish_call(desc);
}

bool Fabric::enable_direct_reads() {
  bool any = false;
  for (Domain& d : domains_) any |= d.transport->enable_direct_reads();
  for (auto& l : links_)
    if (l) l->refresh_caps();
  return any;
}

std::string Fabric::direct_reads_reason() const {
  std::string out;
  for (const Domain& d : domains_) {
    const std::string r = d.transport->direct_reads_reason();
    if (!r.empty()) out += (out.empty() ? "" : "; ") + r;
  }
  return out;
}

void Fabric::close() {
  if (closed_) return;
  closed_ = true;
  // Reverse table order: tcp's progress thread stops before the region it rings is marked closed.
  for (auto it = domains_.rbegin(); it != domains_.rend(); ++it) it->transport->close();
}

}  // namespace commlib
