// The one interface of the stream engine's device paths (issue #36, step 1): the copy path
// (stream/copy_path.h: copy-engine copies through peers' inboxes, ordered by stream memory
// operations), the kernel path (stream/kernel_path.h: one launch interpreting the device plan),
// NCCL's own collective (stream/nccl_link.h, algorithm="nccl") and, for batches of point-to-point
// messages, the point-to-point path (stream/p2p_path.h: the copy path's chunks and the NCCL link's
// group, each message described first). Which one a collective takes is device auto's
// (policy/device_auto.h); the engine numbers the call, checks its peers' state, orders it
// after the previous one, resolves its buffers and hands it to the path, then tracks it in flight
// with what the path returned.
#pragma once

#include <cstdint>
#include <vector>

#include "common/types.h"
#include "device/device.h"
#include "plan/call.h"
#include "plan/plan_cache.h"
#include "transport/transport.h"  // CallDesc

namespace commlib {

// One call as a path enqueues it: the plan (its schedule and resolved algorithm), the call, its
// descriptor, its buffers as addresses (input (or its private copy), output, scratch: the schedule's
// regions resolve against them) and the engine's ordinal of the call. `captured`: the stream is
// capturing a CUDA graph (stream/stream_capture.cc): only the kernel path is asked, and records the
// call as a launch every replay runs (nothing to watch: it returns Launched{}).
// Where a resolved call (the stream engine's PreparedCall) keeps the kernel path's device plan once
// found, so its later launches look nothing up (issue #37): the path that filled it, the plan
// (the path's own entry) and the path's plan generation then (any eviction makes it stale).
struct KernelPlanSlot {
  const void* path = nullptr;
  const void* plan = nullptr;
  uint64_t generation = 0;
};

// A batch of point-to-point messages as the point-to-point path takes it (stream/p2p_path.h): the
// engine checked and numbered it (stream_p2p.cc): each message's descriptor (its count, and the
// pair's message number shared with host messages in `seq`) and its index in the pair's ring of
// device message descriptors (stream/p2p_descriptors.h).
struct P2PBatch {
  const std::vector<P2PItem>& items;
  DType dtype;
  const std::vector<CallDesc>& descs;
  const std::vector<uint64_t>& ring;
};

// A collective: `plan`, `call`, `bases` as above. A batch of point-to-point messages (`batch` set,
// only the point-to-point path takes it): `call` sums the batch up (coll Send, its dtype, its
// messages' total count), `plan` is empty (P2PPath::no_plan(): the messages are the batch's items)
// and `bases` null.
struct PathCall {
  const ResolvedPlan& plan;
  const CollectiveCall& call;
  const CallDesc& desc;
  char* const* bases;  // [3]
  uint64_t seq;
  bool captured = false;
  const struct MappedPeers* mapped = nullptr;  // a one-sided call's route (null: staged)
  KernelPlanSlot* plan_slot = nullptr;  // the prepared call's (null: look the plan up)
  const P2PBatch* batch = nullptr;
};

// A one-sided call's route, the same on every rank (StreamEngine::agree_route, stream_one_sided.cc):
// `mapped`: every rank's input and output are registered (device/peer_buffers.h) and in[q] / out[q]
// are rank q's as this process maps them (this rank's own at its own index); else the staged path.
struct MappedPeers {
  bool mapped = false;
  std::vector<char*> in, out;
};

// What the watchdog watches of a call a path enqueued: `done` (host address) reaches `target` when
// it completes; its first message is with `peer` (-1: none), a send or a receive. A path whose
// waits the watchdog sees one by one (the copy path's) returns it empty.
struct Launched {
  const uint64_t* done = nullptr;
  uint64_t target = 0;
  int peer = -1;
  bool send = false;
  // The same word's device address (map_host), for a stream that waits for the call
  // (Device::wait_value), when `done` is the call's completion word (the kernel path's done word:
  // every block of the launch exited), not only a progress mark; null otherwise.
  const uint64_t* done_dev = nullptr;
};

class DevicePathRunner {
 public:
  virtual ~DevicePathRunner() = default;
  virtual Launched enqueue(const PathCall& call, DeviceStream& stream) = 0;
};

}  // namespace commlib
