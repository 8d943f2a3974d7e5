// Works of the stream engine (see stream_engine.h): a call's completion event, waited on by a
// stream or the host. A work without an event is a call captured in a graph
// (stream/stream_capture.cc): complete at once, nothing to wait for.
#include "stream/stream_engine.h"

namespace commlib {

// -- works ------------------------------------------------------------------------------------

// A device error in a work's call (a sticky CUDA error) is the engine's CommError, never a
// runtime error escaping to the caller.
void DeviceWork::wait(DeviceStream& stream) {
  engine_->throw_if_call_failed(seq_);
  if (!event_) return;  // captured: the graph orders it
  try {
    DeviceGuard guard(engine_->device());
    engine_->device().wait_event(stream, *event_);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    engine_->device_error("wait", e);
  }
}

// Captured calls (no event) are complete at once; others once the engine retired them.
bool DeviceWork::known_complete() const {
  return !event_ || engine_->retired_through_.load(std::memory_order_acquire) >= seq_;
}

bool DeviceWork::is_completed() {
  if (!event_) return true;
  try {
    DeviceGuard guard(engine_->device());
    // Relaxed: polling an eager call's event is safe while the caller's thread captures a graph
    // (a global-mode capture would otherwise be invalidated by the query: docs/gpu.md).
    CaptureModeScope relaxed(engine_->device(), CaptureMode::Relaxed);
    return engine_->device().query(*event_);
  } catch (const std::exception& e) {
    engine_->device_error("is_completed", e);
  }
  return true;
}

void DeviceWork::synchronize() {
  if (!event_) return engine_->throw_if_call_failed(seq_);
  try {
    DeviceGuard guard(engine_->device());
    engine_->device().synchronize(*event_);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    engine_->device_error("synchronize", e);
  }
  engine_->throw_if_call_failed(seq_);
}

}  // namespace commlib
