// The emulated device's query gate (query_gate.h).
#include "device/emulated/query_gate.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace commlib {

namespace {

std::atomic<bool> g_closed{false};  // read by every query: one relaxed load when open
std::mutex g_mu;
std::condition_variable g_cv;
std::thread::id g_owner;  // the thread whose queries pass
int g_held = 0;

}  // namespace

void hold_other_threads_queries(bool close) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_owner = std::this_thread::get_id();
    g_closed.store(close);
  }
  g_cv.notify_all();
}

int queries_held_at_gate() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_held;
}

void pass_query_gate() {
  if (!g_closed.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lk(g_mu);
  if (std::this_thread::get_id() == g_owner) return;
  ++g_held;
  g_cv.wait_for(lk, std::chrono::seconds(5), [] { return !g_closed.load(); });
  --g_held;
}

}  // namespace commlib
