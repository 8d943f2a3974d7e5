// Stream capture and graphs on the emulated device, with CUDA's rules (issue #37; docs/gpu.md
// "Stream capture"), so that code which would fail a capture on a GPU fails it in CI too:
//  - begin_capture puts a stream in capture: every operation enqueued on it from then on becomes a
//    node of the capture's graph (with the values of that moment: a kernel's arguments as captured)
//    and does not run; a replay (launch_graph) runs the nodes again, in their dependency order;
//  - an event recorded on a capturing stream records no node: it remembers the stream's current
//    dependencies, and a stream that waits on it joins the capture (a fork) or, when it already
//    captures into it, adds them to its own (a join); end_capture refuses a capture with a forked
//    stream that was not joined back (cudaErrorStreamCaptureUnjoined);
//  - "potentially unsafe" calls (synchronize, event query, cudaMalloc, cudaFree, synchronous
//    copies, IPC opens) are refused with cudaErrorStreamCaptureUnsupported, invalidating the
//    capture(s) that prohibit them, under cudaThreadExchangeStreamCaptureMode's rules (device.h);
//    some calls conflict with a capture whatever the modes: synchronizing a capturing stream,
//    querying or synchronizing an event last recorded in a capture (cudaErrorCapturedEvent), a
//    capturing stream waiting on an event recorded outside its capture
//    (cudaErrorStreamCaptureIsolation) unless it waits with cudaEventWaitExternal
//    (Device::wait_event_external: an external event wait node, which at each launch waits for
//    the event's records as of that launch; the flag outside a capture is cudaErrorInvalidValue);
//  - an invalidated capture refuses further work (cudaErrorStreamCaptureInvalidated) and its
//    end_capture fails with the same error, returning no graph.
// Not modelled: graph memory nodes (cudaMallocAsync / cudaFreeAsync inside a capture are refused
// with a message saying so), graph updates, conditional nodes, an external wait on an event last
// recorded inside a capture (refused with a message saying so).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"

namespace commlib {

class EmulatedStream;

// One node of a captured graph: the operation as the stream would have run it, the nodes it
// depends on (indices of earlier nodes) and its lane (the stream it was captured on).
struct CapturedOp {
  std::function<void()> fn;
  bool always = false;  // runs even on a faulted device (event-like operations)
  std::vector<uint32_t> deps;
  uint32_t lane = 0;
  // Set for a node whose operation depends on the launch (an external event wait node: the event's
  // records as of the launch): launch_graph makes `fn` with it for each launch.
  std::function<std::function<void()>()> at_launch;
};

// A capture sequence (cudaStreamBeginCapture .. cudaStreamEndCapture).
class EmulatedCapture {
 public:
  EmulatedCapture(uint64_t id, CaptureMode mode, EmulatedStream* origin)
      : id(id), mode(mode), thread(std::this_thread::get_id()), origin(origin) {}
  const uint64_t id;
  const CaptureMode mode;
  const std::thread::id thread;  // the thread that began it
  EmulatedStream* const origin;

  // Appends a node; throws cudaErrorStreamCaptureInvalidated once invalidated.
  uint32_t add(CapturedOp op);
  // The lane of `s` (a new one the first time the stream joins).
  uint32_t lane_of(EmulatedStream* s);
  // A stream of the capture is being destroyed (its lane can never join back).
  void forget_lane(EmulatedStream* s);
  void invalidate(const std::string& why);
  bool invalidated(std::string* why = nullptr);
  bool ended();
  void retain(std::shared_ptr<void> keep);
  // Ends the capture: its nodes, lanes and retained objects move out (nothing more is accepted).
  struct Taken {
    std::vector<CapturedOp> ops;
    std::vector<EmulatedStream*> lanes;
    std::vector<std::shared_ptr<void>> retained;
  };
  Taken end();

 private:
  std::mutex mu_;
  std::vector<CapturedOp> ops_;
  std::vector<EmulatedStream*> lanes_{origin};
  std::vector<std::shared_ptr<void>> retained_;
  bool invalidated_ = false, ended_ = false;
  std::string why_;
};

// The graph end_capture returns, and its instantiation (cudaGraph_t, cudaGraphExec_t).
struct EmulatedGraphBody {
  std::vector<CapturedOp> ops;
  uint32_t lanes = 1;
  bool binds_at_launch = false;  // a node has at_launch
  std::vector<std::shared_ptr<void>> retained;  // CUDA user objects
};
class EmulatedGraph final : public DeviceGraph {
 public:
  explicit EmulatedGraph(std::shared_ptr<const EmulatedGraphBody> b) : body(std::move(b)) {}
  std::shared_ptr<const EmulatedGraphBody> body;
};
class EmulatedGraphExec final : public DeviceGraphExec {
 public:
  explicit EmulatedGraphExec(std::shared_ptr<const EmulatedGraphBody> b) : body(std::move(b)) {}
  std::shared_ptr<const EmulatedGraphBody> body;  // shared with its launches still queued
};

// Runs a graph's nodes (on the launching stream's thread): one host thread per lane, each running
// its lane's nodes in capture order once their dependencies ran, so branches that wait for other
// processes run concurrently as on a GPU (capture order is a topological order, so the earliest
// node not run always can run: no deadlock). A faulted device runs only the `always` nodes.
void run_captured_graph(const EmulatedGraphBody& g);

// The process's captures in progress (for the unsafe-call rules).
std::shared_ptr<EmulatedCapture> emulated_register_capture(CaptureMode mode, EmulatedStream* origin);
void emulated_unregister_capture(const std::shared_ptr<EmulatedCapture>& c);
// Throws cudaErrorStreamCaptureUnsupported (invalidating the prohibiting captures) when a capture
// in progress prohibits the calling thread from the potentially unsafe call `what`.
void emulated_check_capture_safe(const char* what);
CaptureMode emulated_exchange_capture_mode(CaptureMode mode);
// Throws `error` (a CUDA error's name) for a call that conflicts with capture `c` (null: none
// in progress), invalidating it.
[[noreturn]] void emulated_capture_conflict(const std::shared_ptr<EmulatedCapture>& c, const std::string& error,
                                            const std::string& what);

// The stream executing on this thread (set by a stream's thread and by a graph's lane threads):
// its closing flag (a wait on another process gives up when set) and its fault flag, read when an
// operation runs, not when it was enqueued (a captured operation runs on the launching stream).
const std::atomic<bool>* emulated_running_abandon();
const std::atomic<bool>* emulated_running_faulted();
void emulated_set_running_stream(const std::atomic<bool>* abandon, const std::atomic<bool>* faulted);

}  // namespace commlib
