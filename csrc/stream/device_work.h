// A device call's work (stream/stream_engine.h): an event of the call and the engine's number of it.
// What it raises is the engine's error for that call; every raise marks the error told to a caller
// (StreamEngine::take_unreported_error). Its methods are in device_work.cc.
#pragma once

#include <cstdint>
#include <memory>

#include "device/device.h"

namespace commlib {

class StreamEngine;

class DeviceWork {
 public:
  // `seq`: the engine's ordinal of the call (its position among the engine's calls).
  DeviceWork(std::shared_ptr<StreamEngine> engine, std::shared_ptr<DeviceEvent> event, uint64_t seq)
      : engine_(std::move(engine)), event_(std::move(event)), seq_(seq) {}
  // Makes `stream` wait for the call (raises at once if it is already known to have failed).
  void wait(DeviceStream& stream);
  bool is_completed();
  bool known_complete() const;  // the engine retired the call (seen complete): no device call
  // Waits on the host; raises the call's CommError if it failed.
  void synchronize();
  uint64_t seq() const { return seq_; }

 private:
  std::shared_ptr<StreamEngine> engine_;
  std::shared_ptr<DeviceEvent> event_;
  uint64_t seq_;
};

}  // namespace commlib
