// What reaches the caller of the stream engine (see stream_engine.h): a call's completion (its done
// word or event: stream/device_work.h) waited for by a stream or the host, and the engine's error
// raised to a caller, or, when no call, wait or synchronize raised it, taken by close() (issue #35,
// item 2: a blocking call that failed last is never lost). The works themselves: device_work.cc.
#include <chrono>
#include <thread>

#include "device/host_flags.h"
#include "stream/stream_engine.h"

namespace commlib {

namespace {

// How long a done word is still waited for once the engine failed: the abort word releases a
// running launch within microseconds, which then exits and stores it; a launch that never ran
// (a sticky device error before it) never does.
constexpr auto kFailedGrace = std::chrono::seconds(5);

}  // namespace

bool StreamEngine::InFlight::completed(Device& d) const {
  if (!recorded) return false;
  if (done.word) return load_flag(done.word) >= done.target;
  return d.query(*done.event);
}

void StreamEngine::order_after(const Completion& c, DeviceStream& s) {
  if (c.word)
    device_->wait_value(c.word_dev, c.target, s);  // cuStreamWaitValue64 (GEQ) on the done word
  else if (c.event)
    device_->wait_event(s, *c.event);
}

void StreamEngine::wait_done(const Completion& c) {
  if (c.event) {
    DeviceGuard guard(*device_);
    device_->synchronize(*c.event);
    return;
  }
  if (!c.word) return;
  // Spin briefly (a small call completes in microseconds), then yield, then sleep: the ranks this
  // call waits for may share the cores.
  std::chrono::steady_clock::time_point give_up{};
  for (uint32_t spins = 0; load_flag(c.word) < c.target; ++spins) {
    if (failed()) {
      const auto now = std::chrono::steady_clock::now();
      if (give_up == std::chrono::steady_clock::time_point{})
        give_up = now + kFailedGrace;
      else if (now > give_up)
        return;  // the caller raises the engine's error
    }
    if (spins > 4096)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else if (spins > 64)
      std::this_thread::yield();
  }
}

std::shared_ptr<DeviceEvent> StreamEngine::event_after(const Completion& c) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  if (!own_stream_) throw CommError("communicator is closed");
  DeviceGuard current(*device_);
  order_after(c, *own_stream_);
  auto e = device_->create_event();
  device_->record(*e, *own_stream_);
  return e;
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

bool StreamEngine::async_error(ErrorKind* kind, std::string* message) {
  if (!failed()) return false;  // the healthy engine's whole cost
  std::lock_guard<std::mutex> lk(mu_);
  *kind = fail_kind_;
  *message = fail_message_;
  return true;
}

}  // namespace commlib
