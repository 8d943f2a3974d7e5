// A device call's work (stream/stream_engine.h): how the call's completion is learnt, and the
// engine's number of it. What it raises is the engine's error for that call; every raise marks the
// error told to a caller (StreamEngine::take_unreported_error). Its methods are in device_work.cc.
#pragma once

#include <cstdint>
#include <memory>

#include "device/device.h"

namespace commlib {

class StreamEngine;

// How the host and other streams learn that a call completed (docs/gpu.md "The done word"):
// - `word` (host address; `word_dev` the device's) reaching `target`: a kernel-path call whose
//   launch is its last operation. The kernel's last block to exit stores the launch's number
//   there (kernels/plan_kernel.cuh, end_launch), so the host reads it with one load and a stream
//   waits for it with Device::wait_value: no event recorded or queried;
// - `event`: every other call (the copy path, NCCL, point-to-point, a call with work after its
//   launch such as avg's divide, a call whose enqueue failed half-way), recorded at its end;
// - neither: a call captured in a graph (stream/stream_capture.cc): complete at once.
struct Completion {
  std::shared_ptr<DeviceEvent> event;
  const uint64_t* word = nullptr;
  const uint64_t* word_dev = nullptr;
  uint64_t target = 0;
  bool captured() const { return !event && !word; }
};

class DeviceWork {
 public:
  // `seq`: the engine's ordinal of the call (its position among the engine's calls).
  DeviceWork(std::shared_ptr<StreamEngine> engine, Completion done, uint64_t seq)
      : engine_(std::move(engine)), done_(std::move(done)), seq_(seq) {}
  // Makes `stream` wait for the call (raises at once if it is already known to have failed): a
  // stream wait on the done word, or on the call's event.
  void wait(DeviceStream& stream);
  // The done word read once (no device call), or the event queried.
  bool is_completed();
  bool known_complete() const;  // the engine retired the call (seen complete): no device call
  // Waits on the host; raises the call's CommError if it failed.
  void synchronize();
  // An event that completes with the call, for a caller that needs one (a torch Work's CUDA
  // event): the call's own, or, for a done-word call, one recorded now on the engine's own stream
  // after it waits for the word (the only event such a call ever costs). Null for a captured call.
  std::shared_ptr<DeviceEvent> completion_event();
  uint64_t seq() const { return seq_; }
  bool captured() const { return done_.captured(); }  // a call captured in a graph (complete at once)
  const std::shared_ptr<StreamEngine>& engine() const { return engine_; }
  std::shared_ptr<Device> device() const;  // the engine's
  // This handle for another call (StreamEngine::collective_into), so that a steady async call makes
  // none (issue #37, item 2: the bindings' pool, bindings/device_work_pool.h). Only for a handle no one
  // else holds or uses: the caller owns it alone, and every earlier holder's last use of it
  // happens before (the pool's check).
  void rearm(std::shared_ptr<StreamEngine> engine, Completion done, uint64_t seq);

 private:
  std::shared_ptr<StreamEngine> engine_;
  Completion done_;
  uint64_t seq_;
};

}  // namespace commlib
