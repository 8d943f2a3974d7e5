// Call descriptors of peers on other hosts (see stream_engine.h), their own object beside the
// engine's paths (issue #36). Peer memory and the control regions need one
// machine (they are opened through /proc), so a peer on another host has neither: its messages go
// over the nccl link, and the call descriptors that a peer on this host finds in this rank's
// control region go to it in-band instead, as NCCL messages of their own before the call's data.
//
// Why in-band and not on the host control plane: the control plane carries one published call
// per rank (the latest; TCP sends only the newest), while the check needs this rank's descriptor
// for exactly this call number. A host call made right after an enqueued device call publishes a
// higher number before the stream reaches the device call, so the device call's descriptor would
// never be seen. NCCL delivers a pair's messages in order, so the k-th descriptor a rank receives
// from a peer is that peer's k-th call with it. The control plane still carries every device
// call too (publish_call_desc publishes it): a peer in a host call of the same number, or in a device
// call that does not talk to this rank, is found by the watchdog (stream_watchdog.cc).
//
// Per call: a host function writes this rank's descriptors into mapped host memory, the stream
// copies them to device memory (what NCCL sends from on a GPU), one NCCL group sends them and
// receives the peers', the stream copies those back and a host function compares. A mismatch
// fails the engine (MismatchError naming both calls), which aborts the NCCL communicator, so the
// call's data group that follows is released on every rank.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "device/device.h"
#include "stream/copy_path.h"
#include "stream/nccl_link.h"
#include "transport/transport.h"

namespace commlib {

// What the exchange needs of the engine.
class RemoteDescriptorsHost {
 public:
  virtual ~RemoteDescriptorsHost() = default;
  // The device receives waiting for a descriptor (added, or removed once compared): the watchdog
  // looks for host messages of their numbers (stream_p2p.cc).
  virtual void note_p2p_waits(const std::vector<std::pair<int, CallDesc>>& waits, bool add) = 0;
  // From a host function (it may only record): the watchdog fails the engine with it.
  virtual void fail_from_stream(ErrorKind kind, const std::string& message, uint64_t seq) = 0;
};

class RemoteDescriptors {
 public:
  // `failed`: the engine's failed flag (after a failure NCCL moved nothing: nothing to compare).
  RemoteDescriptors(Device& device, NcclLink& nccl, CopyPath& copy, RemoteDescriptorsHost& host,
                    const std::atomic<bool>& failed, int rank, int size);
  // Staging: host memory (mapped for the device) and device memory, each a 64-byte send slot then
  // a receive slot per peer; opened at connect when some peer is on another host, closed at the
  // engine's close after the streams drained (on `s`).
  void open();
  void close(DeviceStream& s);
  // One NCCL group of `sends` (this rank's descriptor to each peer) and of the peers'
  // descriptors, which a host function then compares with `expects`, for the call of the engine's
  // ordinal `seq`. Nothing when both are empty.
  void exchange(const std::vector<std::pair<int, CallDesc>>& sends, const std::vector<std::pair<int, CallDesc>>& expects,
                uint64_t seq, DeviceStream& s);

 private:
  void compare(const std::vector<std::pair<int, CallDesc>>& expects, uint64_t seq);  // a host function

  Device& device_;
  NcclLink& nccl_;
  CopyPath& copy_;
  RemoteDescriptorsHost& host_;
  const std::atomic<bool>& failed_;
  const int rank_, size_;
  char* host_buf_ = nullptr;
  uint64_t* host_dev_ = nullptr;
  void* dev_ = nullptr;
};

}  // namespace commlib
