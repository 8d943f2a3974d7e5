// The lane hold (lane_hold.h). A file, as the read gate's: the test's other processes release it
// with nothing but the file system.
#include "host/lane_hold.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>

namespace commlib {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_armed{false};
std::atomic<bool> g_park_eagerly{false};
std::mutex g_mu;  // guards the four below
int g_lane = -1;
std::string g_path;
double g_max_wait_s = 0;
Clock::time_point g_since{};  // the first held send's time (epoch: none held yet)

}  // namespace

void arm_lane_hold(int lane, const std::string& path, double max_wait_s) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_lane = lane;
  g_path = path;
  g_max_wait_s = max_wait_s;
  g_since = Clock::time_point{};
  g_armed.store(!path.empty(), std::memory_order_release);
}

bool lane_held(int lane) {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_armed.load(std::memory_order_relaxed) || lane != g_lane) return false;
  const Clock::time_point now = Clock::now();
  if (g_since == Clock::time_point{}) g_since = now;
  if (::access(g_path.c_str(), F_OK) == 0 && now - g_since < std::chrono::duration<double>(g_max_wait_s)) return true;
  g_armed.store(false, std::memory_order_relaxed);
  return false;
}

void set_park_eagerly(bool on) { g_park_eagerly.store(on, std::memory_order_relaxed); }

bool park_eagerly() { return g_park_eagerly.load(std::memory_order_relaxed); }

}  // namespace commlib
