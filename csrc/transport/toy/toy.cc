// The toy kind (transport/toy/toy.h): a domain and links of its own classes over what the shm row
// builds, each call passed through, sends counted.
#include "transport/toy/toy.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "transport/registry.h"

namespace commlib {
namespace toy {
namespace {

std::atomic<uint64_t> g_published{0};
std::atomic<bool> g_stutter{false};  // set_stutter

class ToyLink final : public Link {
 public:
  explicit ToyLink(std::unique_ptr<Link> inner) : inner_(std::move(inner)) {}

  ChunkHeader* acquire_send(char** payload) override {
    if (g_stutter.load(std::memory_order_relaxed) && (acquires_++ & 1) == 0) return nullptr;
    return inner_->acquire_send(payload);
  }
  void publish_send() override {
    g_published.fetch_add(1, std::memory_order_relaxed);
    inner_->publish_send();
  }
  const ChunkHeader* peek_recv(const char** payload) override {
    if (g_stutter.load(std::memory_order_relaxed) && (peeks_++ & 1) == 0) return nullptr;
    return inner_->peek_recv(payload);
  }
  void release_recv() override { inner_->release_recv(); }
  void read_peer(void* dst, uint64_t remote, size_t bytes) override { inner_->read_peer(dst, remote, bytes); }
  void ack() override { inner_->ack(); }
  uint64_t acked() override { return inner_->acked(); }
  uint64_t publish_send_in_place(const char* data) override {
    g_published.fetch_add(1, std::memory_order_relaxed);
    return inner_->publish_send_in_place(data);
  }
  uint64_t sends_completed() override { return inner_->sends_completed(); }
  void detach_sends() override { inner_->detach_sends(); }
  void post_recv(const CallDesc& d, char* dst, size_t bytes, size_t chunk) override {
    inner_->post_recv(d, dst, bytes, chunk);
  }
  void unpost_recv() override { inner_->unpost_recv(); }

 protected:
  LinkCaps query_caps() const override {
    inner_->refresh_caps();
    return inner_->caps();
  }

 private:
  std::unique_ptr<Link> inner_;
  uint32_t acquires_ = 0, peeks_ = 0;  // stutter: every other call finds the link full (empty)
};

class ToyTransport final : public Transport {
 public:
  explicit ToyTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<Link> make_link(int peer) override { return std::make_unique<ToyLink>(inner_->make_link(peer)); }
  bool enable_direct_reads() override { return inner_->enable_direct_reads(); }
  SharedFlags* shared_flags() override { return inner_->shared_flags(); }
  std::string direct_reads_reason() const override { return inner_->direct_reads_reason(); }
  uint32_t events() override { return inner_->events(); }
  void wait_events(uint32_t seen, int64_t timeout_us) override { inner_->wait_events(seen, timeout_us); }
  void wake() override { inner_->wake(); }
  void set_waker(Transport* home) override { inner_->set_waker(home); }
  bool spin_until(Transport& home, uint32_t seen) override { return inner_->spin_until(home, seen); }
  PeerStatus peer_status(int peer, bool check_process) override { return inner_->peer_status(peer, check_process); }
  void publish_failure(ErrorKind kind, const std::string& message) override { inner_->publish_failure(kind, message); }
  void publish_call(const CallDesc& d) override { inner_->publish_call(d); }
  bool peer_call(int peer, CallDesc* d) override { return inner_->peer_call(peer, d); }
  int peer_pid(int peer) override { return inner_->peer_pid(peer); }
  void close() override { inner_->close(); }

 private:
  std::unique_ptr<Transport> inner_;
};

// The row it wraps, asked by name through the table (never by including its folder).
const TransportEntry& wrapped() {
  const TransportEntry* e = find_transport("shm");
  if (!e) throw std::logic_error("toy: the shm row is not registered");
  return *e;
}

bool toy_connects(const FabricInputs& in, int peer, std::string* why) {
  if (wrapped().can_connect(in, peer, why)) return true;
  return *why = "as shm: " + *why, false;
}

Domain toy_create(FabricInputs& in, const std::vector<int>& members) {
  Domain d = wrapped().create(in, members);
  d.transport = std::make_unique<ToyTransport>(std::move(d.transport));
  return d;
}

}  // namespace

void set_registered(bool on) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const bool registered = find_transport("toy") != nullptr;
  if (on && !registered)
    register_transport({"toy", 0, true, toy_connects, toy_create});  // ahead of shm (10) and tcp (20)
  else if (!on && registered)
    unregister_transport("toy");
}

uint64_t chunks_published() { return g_published.load(std::memory_order_relaxed); }

void set_stutter(bool on) { g_stutter.store(on, std::memory_order_relaxed); }

}  // namespace toy
}  // namespace commlib
