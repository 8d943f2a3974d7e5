// The stream engine's point-to-point path (issue #36: behind stream/device_path.h like the three
// collective paths): a batch of sends and receives on device buffers, after the engine checked and
// numbered it (stream_p2p.cc).
//
// A message moves like a schedule's message (chunks through the receiver's inbox, counters in the
// control regions: CopyPath::send_chunk / recv_chunk), so point-to-point and collective messages of
// a pair share one chunk order. Messages carry no header, so each is described before it moves
// (stream/p2p_descriptors.h: the ring of descriptors in the receiver's control region, checked
// before a chunk is taken; peers on other hosts get theirs over NCCL, stream/remote_descriptors.h).
// Messages to peers on the nccl link go in one NCCL group instead of the inbox.
#pragma once

#include <cstdint>

#include "device/device.h"
#include "plan/plan_cache.h"
#include "stream/copy_path.h"
#include "stream/device_path.h"
#include "stream/nccl_link.h"
#include "stream/p2p_descriptors.h"
#include "stream/remote_descriptors.h"

namespace commlib {

class P2PPath final : public DevicePathRunner {
 public:
  // `host`: where a descriptor's wait is noted for the watchdog (CopyPathHost::note_wait);
  // `slot_bytes`: the copy path's inbox slot, the chunk a message moves in.
  P2PPath(Device& device, CopyPath& copy, NcclLink& nccl, P2PDescriptors& descs, RemoteDescriptors& remote,
          CopyPathHost& host, uint64_t slot_bytes);

  // `call.batch` (required: std::invalid_argument otherwise): every send's descriptor, then every
  // receive's wait for and check of its descriptor, the nccl link's messages in one group, then the
  // others' chunks, chunk i of every send before chunk i of every receive, as in a schedule step
  // (no deadlock). Returns Launched{}: the engine records an event (the watchdog sees the waits).
  Launched enqueue(const PathCall& call, DeviceStream& stream) override;

  // The plan a batch's PathCall refers to: none (a batch's messages are its items).
  static const ResolvedPlan& no_plan();

 private:
  Device& device_;
  CopyPath& copy_;
  NcclLink& nccl_;
  P2PDescriptors& descs_;
  RemoteDescriptors& remote_;
  CopyPathHost& host_;
  const uint64_t slot_bytes_;
};

}  // namespace commlib
