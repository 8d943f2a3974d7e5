// The emulated device's streams (emulated_device.h): each a worker thread that runs its operations
// in enqueue order on one of the device's hardware queues, after the data delay
// (COMMLIB_EMULATED_DELAY_US), and records them instead while a capture is under way
// (emulated_capture.h). Apart from emulated_device.cc, which keeps the device: its driver calls,
// kernels, faults and current-device guards.
#include <sched.h>

#include <chrono>

#include "device/emulated/emulated_device.h"

namespace commlib {

EmulatedStream::EmulatedStream(int64_t delay_us, std::shared_ptr<HardwareQueue> queue)
    : delay_us_(delay_us), hw_(std::move(queue)), thread_([this] { run(); }) {}

EmulatedStream::~EmulatedStream() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    if (capture_) {  // its lane can never join back
      capture_->forget_lane(this);
      capture_->invalidate("a stream of the capture was destroyed while capturing");
    }
  }
  closing_.store(true, std::memory_order_release);
  cv_.notify_all();
  thread_.join();
}

void EmulatedStream::enqueue_data(std::function<void()> op) {
  if (delay_us_ <= 0) return enqueue(std::move(op));
  enqueue([this, op = std::move(op)] {
    delay();
    op();
  });
}

void EmulatedStream::fault() {
  faulted_.store(true, std::memory_order_release);
  closing_.store(true, std::memory_order_release);  // a wait on another process stops
}

void EmulatedStream::enqueue(std::function<void()> op, bool always) {
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (capture_) {  // recorded into the graph, not run
      const uint32_t node = capture_->add(CapturedOp{std::move(op), always, capture_deps_, capture_lane_});
      capture_deps_.assign(1, node);
      return;
    }
    queue_.push_back(Op{std::move(op), always, hw_->take_ticket()});
    ++enqueued_;
    wake = thread_sleeping_;
  }
  if (wake) cv_.notify_all();
}

bool EmulatedStream::capture_bound(std::function<std::function<void()>()> bind) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!capture_) return false;
  CapturedOp op{[] {}, false, capture_deps_, capture_lane_};
  op.at_launch = std::move(bind);
  const uint32_t node = capture_->add(std::move(op));
  capture_deps_.assign(1, node);
  return true;
}

std::shared_ptr<EmulatedCapture> EmulatedStream::capture() {
  std::lock_guard<std::mutex> lk(mu_);
  return capture_;
}

void EmulatedStream::start_capture(std::shared_ptr<EmulatedCapture> c, uint32_t lane, std::vector<uint32_t> deps) {
  std::lock_guard<std::mutex> lk(mu_);
  capture_ = std::move(c);
  capture_lane_ = lane;
  capture_deps_ = std::move(deps);
}

std::vector<uint32_t> EmulatedStream::capture_deps() {
  std::lock_guard<std::mutex> lk(mu_);
  return capture_deps_;
}

void EmulatedStream::add_capture_deps(const std::vector<uint32_t>& deps) {
  std::lock_guard<std::mutex> lk(mu_);
  for (uint32_t d : deps)
    if (std::find(capture_deps_.begin(), capture_deps_.end(), d) == capture_deps_.end()) capture_deps_.push_back(d);
}

std::vector<uint32_t> EmulatedStream::stop_capture(const EmulatedCapture* c) {
  std::lock_guard<std::mutex> lk(mu_);
  if (capture_.get() != c) return {};
  capture_.reset();
  return std::move(capture_deps_);
}

bool EmulatedStream::busy() {
  std::lock_guard<std::mutex> lk(mu_);
  return executed_ < enqueued_;
}

void EmulatedStream::synchronize() {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t target = enqueued_;
  ++sync_waiters_;
  cv_.wait(lk, [&] { return executed_ >= target; });
  --sync_waiters_;
}

void EmulatedStream::delay() const {
  if (delay_us_ <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(delay_us_);
  if (delay_us_ >= 200) {
    std::this_thread::sleep_until(until);
    return;
  }
  // Short delays: a sleep would take the timer slack (~50 us) instead; yield the core meanwhile.
  while (std::chrono::steady_clock::now() < until) sched_yield();
}

void EmulatedStream::run() {
  emulated_set_running_stream(&closing_, &faulted_);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (queue_.empty() && !stop_) {
      thread_sleeping_ = true;
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      thread_sleeping_ = false;
    }
    if (queue_.empty()) return;  // stop_ and drained
    std::function<void()> op = std::move(queue_.front().fn);
    const bool always = queue_.front().always;
    const uint64_t ticket = queue_.front().ticket;
    queue_.pop_front();
    lk.unlock();
    hw_->wait_turn(ticket, &closing_);  // the streams sharing the hardware queue, in enqueue order
    // Operations do not throw (the engine records its own failures). A faulted device executes
    // nothing more, but event records still mark their events, so waiters wake and see the fault.
    if (always || !faulted_.load(std::memory_order_acquire)) op();
    op = nullptr;
    hw_->finished(ticket);
    lk.lock();
    ++executed_;
    if (sync_waiters_) cv_.notify_all();
  }
}

}  // namespace commlib
