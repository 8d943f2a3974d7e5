// What reaches the caller of the stream engine (see stream_engine.h): the engine's error raised to
// a caller, or, when no call, wait or synchronize raised it, taken by close() (issue #35, item 2: a
// blocking call that failed last is never lost). The works themselves: device_work.cc.
#include "stream/stream_engine.h"

namespace commlib {

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
