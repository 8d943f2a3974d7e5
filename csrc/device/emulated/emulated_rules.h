// CUDA's documented rules that the emulated device enforces (issue #23), so that code which
// would hang or fail on a GPU hangs or fails in CI too:
//  - one host-function thread per process: the host functions of every stream run there, one at
//    a time, in the order the streams reach them (CUDA: host functions "may be serialized"); a
//    host function that waits for another process's progress blocks every other stream's;
//  - no device or NCCL call from inside a host function (cudaErrorNotPermitted): refused and
//    counted;
//  - a current device per thread: kernels and event records on a stream of another device fail;
//    a device call from a thread that never set one is counted as a context created on device 0;
//  - a bounded number of hardware queues (CUDA_DEVICE_MAX_CONNECTIONS; COMMLIB_EMULATED_CONNECTIONS
//    here): streams share them round robin, and the operations of the streams of one queue run in
//    the order they were enqueued, so a blocked wait holds up every stream behind it on its queue;
//  - cudaFree synchronises the device: a free that finds work unfinished on one of the device's
//    streams (a stream parked in a wait for a peer, inside an enqueue) is counted, then waits;
//  - IPC: freeing memory a peer still maps (an export not closed by every importer) is counted.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <condition_variable>
#include <mutex>
#include <string>

namespace commlib {

struct EmulatedRuleCounts {
  uint64_t stray_contexts = 0;            // device calls from threads that never set a device
  uint64_t host_function_violations = 0;  // device / NCCL calls from inside host functions
  uint64_t frees_while_busy = 0;          // cudaFree-like frees that had to wait for streams' work
  uint64_t exports_freed_while_mapped = 0;  // exported memory freed while a peer still mapped it
  // Not rules, what the per-call costs are made of (issue #25): host functions enqueued, events
  // created (cudaEventCreate) and events alive now, by every engine of the process.
  uint64_t host_functions = 0;
  uint64_t events_created = 0;
  int64_t events_alive = 0;
  std::string last_violation;
};
EmulatedRuleCounts emulated_rule_counts();
// Counts a free that found unfinished stream work / an export still mapped by a peer.
void emulated_count_busy_free(const std::string& what);
void emulated_count_mapped_export_free(const std::string& what);
void emulated_count_host_function();
void emulated_count_event(int delta);  // +1 created, -1 destroyed

// Runs fn on the process's host-function thread and returns once it ran.
void run_host_function(std::function<void()> fn);
bool emulated_in_host_function();

// The calling thread's current emulated device (-1: none set yet).
int emulated_current_device();
void emulated_set_current_device(int index);

// At the top of every emulated device call: refuses (throws, counts) a call from inside a host
// function; a thread without a current device gets device 0 and a stray context counted; with
// `needs_current`, a device other than `index` current is an error (kernels, event records).
void emulated_enter(const char* what, int index, bool needs_current);
// For the emulated NCCL: the message of a call made from inside a host function (counted), or "".
std::string emulated_host_function_violation(const char* what);

// One hardware queue: operations take a ticket when enqueued and run in ticket order across the
// streams that share the queue.
class HardwareQueue {
 public:
  uint64_t take_ticket();
  // Blocks until every earlier ticket of the queue ran (or `abandon` is set: a closing or
  // faulted stream stops waiting for its turn).
  void wait_turn(uint64_t ticket, const std::atomic<bool>* abandon);
  void finished(uint64_t ticket);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0, done_ = 0;
};

}  // namespace commlib
