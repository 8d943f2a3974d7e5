// The one interface of the stream engine's three device paths (issue #36, step 1): the copy path
// (stream/copy_path.h: copy-engine copies through peers' inboxes, ordered by stream memory
// operations), the kernel path (stream/kernel_path.h: one launch interpreting the device plan) and
// NCCL's own collective (stream/nccl_link.h, algorithm="nccl"). Which one a call takes is device
// auto's (policy/device_auto.h); the engine numbers the call, checks its peers' state, orders it
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
struct PathCall {
  const ResolvedPlan& plan;
  const CollectiveCall& call;
  const CallDesc& desc;
  char* const* bases;  // [3]
  uint64_t seq;
  bool captured = false;
  const struct MappedPeers* mapped = nullptr;  // a one-sided call's route (null: staged)
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
