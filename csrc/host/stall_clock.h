// The clock of the executor's waits (run_step's and run_lanes' loops, executor.cc and
// executor_lanes.cc): how long nothing has moved, which on_idle compares with the timeout to name a
// stuck peer, and when the slow checks (/proc, a peer's call) are due again. The clock is read only
// once a pass moved nothing: a small message usually completes without waiting, and two clock reads
// per call show on the latency path.
#pragma once

#include <chrono>
#include <cstdint>

namespace commlib {

// Longest single sleep on the doorbell (Fabric::wait_events), and how often a stalled wait runs the
// slow checks.
constexpr int64_t kSleepSliceUs = 50 * 1000;
constexpr auto kSlowCheckEvery = std::chrono::milliseconds(100);

class StallClock {
 public:
  using Clock = std::chrono::steady_clock;

  // Something moved: the next stall starts the idle time afresh.
  void progressed() { fresh_ = true; }

  // Nothing moved in a pass. Returns whether the slow checks are due (the first stall starts their
  // interval; each time they are due it starts again).
  bool stalled() {
    const Clock::time_point now = Clock::now();
    if (!started_) {
      last_slow_ = now;
      started_ = true;
    }
    if (fresh_) {
      last_progress_ = now;
      fresh_ = false;
    }
    if (now - last_slow_ < kSlowCheckEvery) return false;
    last_slow_ = now;
    return true;
  }

  // When the current stall began (the first stall after the last progress).
  Clock::time_point last_progress() const { return last_progress_; }

 private:
  Clock::time_point last_progress_, last_slow_;
  bool started_ = false, fresh_ = true;
};

}  // namespace commlib
