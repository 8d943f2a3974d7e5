// Works of the stream engine (see stream_engine.h and device_work.h): a call's done word or its
// completion event, waited on by a stream or the host. A work with neither is a call captured in a
// graph (stream/stream_capture.cc): complete at once, nothing to wait for.
#include "device/host_flags.h"
#include "stream/stream_engine.h"

namespace commlib {

// -- works ------------------------------------------------------------------------------------

// A device error in a work's call (a sticky CUDA error) is the engine's CommError, never a
// runtime error escaping to the caller.
void DeviceWork::wait(DeviceStream& stream) {
  engine_->throw_if_call_failed(seq_);
  if (done_.captured()) return;  // the graph orders it
  try {
    DeviceGuard guard(engine_->device());
    engine_->order_after(done_, stream);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    engine_->device_error("wait", e);
  }
}

// Captured calls are complete at once; others once the engine retired them.
bool DeviceWork::known_complete() const {
  return done_.captured() || engine_->retired_through_.load(std::memory_order_acquire) >= seq_;
}

bool DeviceWork::is_completed() {
  if (done_.captured()) return true;
  if (done_.word) return load_flag(done_.word) >= done_.target;  // no device call, capture-safe
  try {
    DeviceGuard guard(engine_->device());
    // Relaxed: polling an eager call's event is safe while the caller's thread captures a graph
    // (a global-mode capture would otherwise be invalidated by the query: docs/gpu.md).
    CaptureModeScope relaxed(engine_->device(), CaptureMode::Relaxed);
    return engine_->device().query(*done_.event);
  } catch (const std::exception& e) {
    engine_->device_error("is_completed", e);
  }
  return true;
}

void DeviceWork::synchronize() {
  if (done_.captured()) return engine_->throw_if_call_failed(seq_);
  try {
    engine_->wait_done(done_);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    engine_->device_error("synchronize", e);
  }
  engine_->throw_if_call_failed(seq_);
}

std::shared_ptr<Device> DeviceWork::device() const { return engine_->shared_device(); }

void DeviceWork::rearm(std::shared_ptr<StreamEngine> engine, Completion done, uint64_t seq) {
  engine_ = std::move(engine);
  done_ = std::move(done);
  seq_ = seq;
}

std::shared_ptr<DeviceEvent> DeviceWork::completion_event() {
  if (done_.event || done_.captured()) return done_.event;
  try {
    return engine_->event_after(done_);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    engine_->device_error("completion_event", e);
  }
}

}  // namespace commlib
