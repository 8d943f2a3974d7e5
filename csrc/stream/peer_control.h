// What the stream engine uses of its communicator (StreamEngine's PeerControl), in a header of its
// own so that the engine's parts that need it (the point-to-point descriptors, the bindings'
// adapter over a host communicator, bindings/peer_control.h) include the interface, not the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/errors.h"
#include "transport/transport.h"  // CallDesc, PeerStatus

namespace commlib {

// What the engine uses of its communicator: peer liveness and failure propagation (the
// transport's control plane), the call numbering shared with host calls and the published call
// (so a host call and a device call of the same number are a mismatch), and the host side's
// abort in both directions. Kept to this one adapter so the control plane can change under it.
class PeerControl {
 public:
  virtual ~PeerControl() = default;
  virtual PeerStatus peer_status(int peer, bool check_process) = 0;
  virtual int peer_pid(int peer) = 0;
  virtual void publish_failure(ErrorKind kind, const std::string& message) = 0;
  virtual uint64_t next_call_seq() = 0;
  virtual uint64_t peek_call_seq() = 0;
  virtual void publish_call(const CallDesc& desc) = 0;
  virtual bool peer_call(int peer, CallDesc* desc) = 0;
  // Aborts the host side with the engine's error (the peers were told already).
  virtual void fail_host(ErrorKind kind, const std::string& message) = 0;
  // fn hears of the host side's abort; returns an id for remove_host_listener.
  virtual int on_host_abort(std::function<void(ErrorKind, const std::string&)> fn) = 0;
  virtual void remove_host_listener(int id) = 0;
  // fn runs when the host side closes, before its transport goes (the engine closes there: its
  // works may keep it alive after the communicator); returns an id for remove_close_listener.
  virtual int on_host_close(std::function<void()> fn) = 0;
  virtual void remove_close_listener(int id) = 0;
  // Point-to-point: one numbering per pair with the host messages, the host link's next message
  // from `peer` (false while a host call runs), and the probe the host executor asks whether a
  // receive's message came on a device buffer (Communicator::next_p2p_seq and the rest).
  virtual uint64_t next_p2p_seq(int peer, bool send) = 0;
  virtual uint64_t peek_p2p_seq(int peer, bool send) = 0;
  virtual bool peek_host_message(int peer, CallDesc* desc) = 0;
  virtual int add_p2p_probe(std::function<bool(int, const CallDesc&, CallDesc*)> fn) = 0;
  virtual void remove_p2p_probe(int id) = 0;
};

}  // namespace commlib
