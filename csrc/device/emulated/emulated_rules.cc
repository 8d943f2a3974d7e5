// The CUDA rules the emulated device enforces (see emulated_rules.h).
#include "device/emulated/emulated_rules.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace commlib {

namespace {

thread_local bool t_in_host_function = false;
thread_local int t_current = -1;

std::atomic<uint64_t> g_stray{0};
std::atomic<uint64_t> g_violations{0};
std::atomic<uint64_t> g_busy_frees{0};
std::atomic<uint64_t> g_mapped_frees{0};
std::atomic<uint64_t> g_host_functions{0};
std::atomic<uint64_t> g_events_created{0};
std::atomic<int64_t> g_events_alive{0};
std::mutex g_violation_mu;
std::string g_last_violation;

struct Job {
  std::function<void()> fn;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

// The process's one host-function thread (CUDA runs host functions on a driver thread per
// context; several streams' functions queue behind one another there). Never destroyed: streams
// may hand it work until the process exits.
class HostFunctionThread {
 public:
  HostFunctionThread() : thread_([this] { run(); }) { thread_.detach(); }

  void submit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(job);
    }
    cv_.notify_one();
  }

 private:
  void run() {
    t_in_host_function = true;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return !queue_.empty(); });
      std::shared_ptr<Job> job = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      try {
        job->fn();
      } catch (const std::exception& e) {  // a refused call inside it: counted where refused
        std::lock_guard<std::mutex> g(g_violation_mu);
        g_last_violation = std::string("a host function threw: ") + e.what();
      }
      job->fn = nullptr;
      {
        std::lock_guard<std::mutex> g(job->mu);
        job->done = true;
      }
      job->cv.notify_all();
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::thread thread_;
};

HostFunctionThread& host_function_thread() {
  static auto* t = new HostFunctionThread();
  return *t;
}

void count_violation(const std::string& msg) {
  g_violations.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(g_violation_mu);
  g_last_violation = msg;
}

}  // namespace

EmulatedRuleCounts emulated_rule_counts() {
  EmulatedRuleCounts c;
  c.stray_contexts = g_stray.load();
  c.host_function_violations = g_violations.load();
  c.frees_while_busy = g_busy_frees.load();
  c.exports_freed_while_mapped = g_mapped_frees.load();
  c.host_functions = g_host_functions.load();
  c.events_created = g_events_created.load();
  c.events_alive = g_events_alive.load();
  std::lock_guard<std::mutex> g(g_violation_mu);
  c.last_violation = g_last_violation;
  return c;
}

void emulated_count_busy_free(const std::string& what) {
  g_busy_frees.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(g_violation_mu);
  g_last_violation = what;
}

void emulated_count_mapped_export_free(const std::string& what) {
  g_mapped_frees.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(g_violation_mu);
  g_last_violation = what;
}

void emulated_count_host_function() { g_host_functions.fetch_add(1, std::memory_order_relaxed); }

void emulated_count_event(int delta) {
  if (delta > 0) g_events_created.fetch_add(1, std::memory_order_relaxed);
  g_events_alive.fetch_add(delta, std::memory_order_relaxed);
}

void run_host_function(std::function<void()> fn) {
  auto job = std::make_shared<Job>();
  job->fn = std::move(fn);
  host_function_thread().submit(job);
  std::unique_lock<std::mutex> lk(job->mu);
  job->cv.wait(lk, [&] { return job->done; });
}

bool emulated_in_host_function() { return t_in_host_function; }

int emulated_current_device() { return t_current; }

void emulated_set_current_device(int index) { t_current = index; }

std::string emulated_host_function_violation(const char* what) {
  if (!t_in_host_function) return "";
  const std::string msg = std::string(what) + " called from inside a host function (CUDA: cudaErrorNotPermitted)";
  count_violation(msg);
  return msg;
}

void emulated_enter(const char* what, int index, bool needs_current) {
  if (t_in_host_function) {
    const std::string msg = emulated_host_function_violation(what);
    throw std::runtime_error("cudaErrorNotPermitted (emulated): " + msg);
  }
  if (t_current < 0) {  // CUDA would create (and make current) the primary context of device 0
    g_stray.fetch_add(1, std::memory_order_relaxed);
    t_current = 0;
    std::lock_guard<std::mutex> g(g_violation_mu);
    g_last_violation = std::string(what) + " from a thread that never set a device (a context on device 0)";
  }
  if (needs_current && t_current != index)
    throw std::runtime_error(std::string("cudaErrorInvalidResourceHandle (emulated): ") + what + " on a stream of emulated:" +
                             std::to_string(index) + " while emulated:" + std::to_string(t_current) +
                             " is this thread's current device");
}

uint64_t HardwareQueue::take_ticket() {
  std::lock_guard<std::mutex> lk(mu_);
  return next_++;
}

void HardwareQueue::wait_turn(uint64_t ticket, const std::atomic<bool>* abandon) {
  std::unique_lock<std::mutex> lk(mu_);
  while (done_ < ticket && !(abandon && abandon->load(std::memory_order_acquire)))
    cv_.wait_for(lk, std::chrono::milliseconds(20));  // abandon is set without this lock
}

void HardwareQueue::finished(uint64_t ticket) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_ < ticket + 1) done_ = ticket + 1;
  }
  cv_.notify_all();
}

}  // namespace commlib
