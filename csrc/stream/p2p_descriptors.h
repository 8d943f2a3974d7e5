// Point-to-point message descriptors on device buffers (stream_p2p.cc moves the messages), their
// own object beside the engine's paths (issue #36): each message is described before it moves.
// The sender's stream writes (message number of the pair, count, dtype) into a ring in the
// receiver's control region (CopyPath::p2p_slot, CopyPath::kP2PRing slots per sender), and the
// receiver's stream waits for that descriptor and compares it with its own receive before it
// takes a chunk; a different count or dtype fails the engine with MismatchError naming both.
// Host and device messages of a pair share one numbering (PeerControl::next_p2p_seq): a device
// message of the number a host receive waits for (the host executor's probe, device_message), or
// a host message of the number a device receive waits for (the watchdog, host_message_mismatch),
// is a mismatch too.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "plan/call.h"
#include "stream/copy_path.h"
#include "transport/transport.h"

namespace commlib {

class PeerControl;

class P2PDescriptors {
 public:
  // `host`: where a mismatch found on the stream is recorded (CopyPathHost::fail_from_stream);
  // `failed`: the engine's failed flag (after a failure a released wait finds no descriptor).
  P2PDescriptors(CopyPath& copy, PeerControl& control, CopyPathHost& host, const std::atomic<bool>& failed, int rank,
                 int size);

  // The pair's next device message index (the ring position) of a send to or receive from `peer`
  // (enqueue state: the engine's enqueue lock held).
  uint64_t next_index(int peer, bool send) { return send ? ++sent_[peer] : ++received_[peer]; }
  // Run on the stream: the sender's descriptor `desc` of message `k` into the receiver's ring.
  void send(int peer, uint64_t k, const CallDesc& desc);
  // Run on the stream after its wait_value on the slot's word: compares the sent descriptor with
  // `desc`; a mismatch is recorded for the watchdog with the engine's number of the call (`call`).
  void check(int peer, uint64_t k, const CallDesc& desc, uint64_t call);
  // The device receives waiting for their descriptor (added, or removed once checked).
  void note_waits(const std::vector<std::pair<int, CallDesc>>& waits, bool add);
  // The host executor's probe: the message `want` from `peer` came on a device buffer (`*sent`).
  bool device_message(int peer, const CallDesc& want, CallDesc* sent) const;
  // The watchdog's look: a device receive waiting for a message the peer sent from a host buffer
  // (`*message`: the mismatch, naming both).
  bool host_message_mismatch(std::string* message);
  // The same for a first device call of point-to-point messages, while it waits for the peers.
  bool first_call_mismatch(const std::vector<P2PItem>& items, DType dtype, std::string* message) const;

 private:
  CopyPath& copy_;
  PeerControl& control_;
  CopyPathHost& host_;
  const std::atomic<bool>& failed_;
  const int rank_, size_;
  std::vector<uint64_t> sent_, received_;  // device messages per peer
  std::mutex mu_;
  std::vector<std::pair<int, CallDesc>> waits_;  // device receives waiting for their descriptor
};

}  // namespace commlib
