// What reaches the caller of the stream engine (see stream_engine.h): works, and the engine's error
// raised to a caller, or, when no call, wait or synchronize raised it, taken by close() (issue #35,
// item 2: a blocking call that failed last is never lost).
#include "stream/stream_engine.h"

namespace commlib {

// -- works ------------------------------------------------------------------------------------

// A device error in a work's call (a sticky CUDA error) is the engine's CommError, never a
// runtime error escaping to the caller.
void DeviceWork::wait(DeviceStream& stream) {
  engine_->throw_if_call_failed(seq_);
  try {
    DeviceGuard guard(engine_->device());
    engine_->device().wait_event(stream, *event_);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    engine_->device_error("wait", e);
  }
}

bool DeviceWork::is_completed() {
  try {
    DeviceGuard guard(engine_->device());
    return engine_->device().query(*event_);
  } catch (const std::exception& e) {
    engine_->device_error("is_completed", e);
  }
  return true;
}

bool DeviceWork::known_complete() const { return engine_->retired_through_.load(std::memory_order_acquire) >= seq_; }

void DeviceWork::synchronize() {
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

void StreamEngine::raise_to_caller(ErrorKind kind, const std::string& message) {
  reported_.store(true, std::memory_order_release);
  throw_kind(kind, message);
}

bool StreamEngine::take_unreported_error(ErrorKind* kind, std::string* message) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!failed() || failed_from_seq_ > seq_ || reported_.exchange(true)) return false;
  *kind = fail_kind_;
  *message = fail_message_;
  return true;
}

}  // namespace commlib
