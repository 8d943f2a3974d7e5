#include "bindings/peer_control.h"

#include <functional>
#include <string>
#include <utility>

namespace commlib {

namespace {

class CommunicatorPeerControl final : public PeerControl {
 public:
  explicit CommunicatorPeerControl(Communicator& c) : c_(c) {}
  PeerStatus peer_status(int peer, bool check_process) override {
    return c_.transport().peer_status(peer, check_process);
  }
  int peer_pid(int peer) override { return c_.transport().peer_pid(peer); }
  void publish_failure(ErrorKind kind, const std::string& message) override {
    c_.transport().publish_failure(kind, message);
  }
  uint64_t next_call_seq() override { return c_.next_call_seq(); }
  uint64_t peek_call_seq() override { return c_.peek_call_seq(); }
  void publish_call(const CallDesc& desc) override { c_.publish_call(desc); }
  bool peer_call(int peer, CallDesc* desc) override { return c_.transport().peer_call(peer, desc); }
  void fail_host(ErrorKind kind, const std::string& message) override { c_.fail_from_engine(kind, message); }
  int on_host_abort(std::function<void(ErrorKind, const std::string&)> fn) override {
    return c_.add_abort_listener(std::move(fn));
  }
  void remove_host_listener(int id) override { c_.remove_abort_listener(id); }
  int on_host_close(std::function<void()> fn) override { return c_.add_close_listener(std::move(fn)); }
  void remove_close_listener(int id) override { c_.remove_close_listener(id); }
  uint64_t next_p2p_seq(int peer, bool send) override { return c_.next_p2p_seq(peer, send); }
  uint64_t peek_p2p_seq(int peer, bool send) override { return c_.peek_p2p_seq(peer, send); }
  bool peek_host_message(int peer, CallDesc* desc) override { return c_.peek_host_message(peer, desc); }
  int add_p2p_probe(std::function<bool(int, const CallDesc&, CallDesc*)> fn) override {
    return c_.add_p2p_probe(std::move(fn));
  }
  void remove_p2p_probe(int id) override { c_.remove_p2p_probe(id); }

 private:
  Communicator& c_;
};

}  // namespace

std::unique_ptr<PeerControl> communicator_peer_control(Communicator& comm) {
  return std::make_unique<CommunicatorPeerControl>(comm);
}

}  // namespace commlib
