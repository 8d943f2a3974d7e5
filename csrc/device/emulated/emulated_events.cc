// The emulated device's events (emulated_device.h): sequence points on a stream, and inside a
// stream capture the markers that fork and join streams into it (emulated_capture.h). Split from
// emulated_device.cc, which keeps the device (kernels, faults, driver calls); streams in
// emulated_stream.cc.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/emulated/emulated_device.h"
#include "device/emulated/emulated_rules.h"
#include "device/emulated/query_gate.h"

namespace commlib {

namespace {

class EmulatedEvent final : public DeviceEvent, public std::enable_shared_from_this<EmulatedEvent> {
 public:
  EmulatedEvent() { emulated_count_event(+1); }
  ~EmulatedEvent() override { emulated_count_event(-1); }
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;  // records enqueued
  uint64_t reached = 0;   // records the stream has passed
  // Last recorded inside this capture (cudaErrorCapturedEvent for a query), with the capturing
  // stream's dependencies at the record: a stream waiting on it joins the capture.
  std::shared_ptr<EmulatedCapture> captured;
  std::vector<uint32_t> captured_deps;
};

EmulatedStream& emu(DeviceStream& s) { return static_cast<EmulatedStream&>(s); }

}  // namespace

std::shared_ptr<DeviceEvent> EmulatedDevice::create_event() {
  enter("cudaEventCreate");
  return std::make_shared<EmulatedEvent>();
}

void EmulatedDevice::record(DeviceEvent& event, DeviceStream& stream) {
  enter("cudaEventRecord", true);
  auto& e = static_cast<EmulatedEvent&>(event);
  if (std::shared_ptr<EmulatedCapture> c = emu(stream).capture()) {  // a marker in the graph, no node
    std::string why;
    if (c->invalidated(&why)) emulated_capture_conflict(nullptr, "cudaErrorStreamCaptureInvalidated", "the capture was invalidated (" + why + ")");
    std::lock_guard<std::mutex> lk(e.mu);
    e.captured = std::move(c);
    e.captured_deps = emu(stream).capture_deps();
    return;
  }
  uint64_t target;
  {
    std::lock_guard<std::mutex> lk(e.mu);
    target = ++e.recorded;
    e.captured.reset();
    e.captured_deps.clear();
  }
  auto ep = e.shared_from_this();  // the operation keeps the event alive
  emu(stream).enqueue([ep, target] {
    {
      std::lock_guard<std::mutex> lk(ep->mu);
      if (ep->reached < target) ep->reached = target;
    }
    ep->cv.notify_all();
  }, /*always=*/true);
}

void EmulatedDevice::wait_event(DeviceStream& stream, DeviceEvent& event) {
  enter("cudaStreamWaitEvent");
  auto& e = static_cast<EmulatedEvent&>(event);
  uint64_t target;
  std::shared_ptr<EmulatedCapture> captured;
  std::vector<uint32_t> deps;
  {
    std::lock_guard<std::mutex> lk(e.mu);
    target = e.recorded;
    captured = e.captured;
    deps = e.captured_deps;
  }
  const std::shared_ptr<EmulatedCapture> mine = emu(stream).capture();
  if (captured) {  // a fork (the stream joins the capture) or a join (it adds the event's dependencies)
    if (captured->ended())
      emulated_capture_conflict(mine, "cudaErrorCapturedEvent", "cudaStreamWaitEvent on an event last recorded in a capture that ended");
    if (mine && mine != captured) {
      captured->invalidate("a stream of another capture waited on its event");
      emulated_capture_conflict(mine, "cudaErrorStreamCaptureIsolation", "cudaStreamWaitEvent merging two captures (the event was recorded in another one)");
    }
    if (mine) return emu(stream).add_capture_deps(deps);
    return emu(stream).start_capture(captured, captured->lane_of(&emu(stream)), std::move(deps));
  }
  if (target == 0) return;
  if (mine)
    emulated_capture_conflict(mine, "cudaErrorStreamCaptureIsolation",
                     "a capturing stream waited on an event recorded outside the capture (CUDA needs cudaEventWaitExternal)");
  auto ep = e.shared_from_this();
  emu(stream).enqueue([ep, target] {
    std::unique_lock<std::mutex> lk(ep->mu);
    ep->cv.wait(lk, [&] { return ep->reached >= target; });
  });
}

void EmulatedDevice::wait_event_external(DeviceStream& stream, DeviceEvent& event) {
  enter("cudaStreamWaitEvent");  // (the same runtime call, with the cudaEventWaitExternal flag)
  auto& e = static_cast<EmulatedEvent&>(event);
  const std::shared_ptr<EmulatedCapture> mine = emu(stream).capture();
  if (!mine)
    throw std::runtime_error("cudaErrorInvalidValue (emulated): cudaStreamWaitEvent with cudaEventWaitExternal on a "
                             "stream that is not capturing (the flag is valid only during stream capture)");
  {
    std::lock_guard<std::mutex> lk(e.mu);
    if (e.captured)
      throw std::runtime_error("emulated device: an external event wait (cudaEventWaitExternal) on an event last "
                               "recorded inside a stream capture is not modelled");
  }
  std::string why;
  if (mine->invalidated(&why))
    emulated_capture_conflict(nullptr, "cudaErrorStreamCaptureInvalidated", "the capture was invalidated (" + why + ")");
  // An external event wait node: at each launch of the graph, the event's records as of the launch.
  auto ep = e.shared_from_this();
  emu(stream).capture_bound([ep]() -> std::function<void()> {
    uint64_t target;
    {
      std::lock_guard<std::mutex> lk(ep->mu);
      target = ep->recorded;
    }
    return [ep, target] {
      std::unique_lock<std::mutex> lk(ep->mu);
      ep->cv.wait(lk, [&] { return ep->reached >= target; });
    };
  });
}

bool EmulatedDevice::query(DeviceEvent& event) {
  enter("cudaEventQuery", false, true);
  pass_query_gate();
  auto& e = static_cast<EmulatedEvent&>(event);
  std::lock_guard<std::mutex> lk(e.mu);
  if (e.captured)
    emulated_capture_conflict(nullptr, "cudaErrorCapturedEvent", "cudaEventQuery on an event last recorded inside a stream capture");
  return e.reached >= e.recorded;
}

void EmulatedDevice::synchronize(DeviceEvent& event) {
  enter("cudaEventSynchronize", false, true);
  auto& e = static_cast<EmulatedEvent&>(event);
  {
    std::unique_lock<std::mutex> lk(e.mu);
    if (e.captured)
      emulated_capture_conflict(nullptr, "cudaErrorCapturedEvent", "cudaEventSynchronize on an event last recorded inside a stream capture");
    const uint64_t target = e.recorded;
    e.cv.wait(lk, [&] { return e.reached >= target; });
  }
  enter("cudaEventSynchronize");  // a fault meanwhile is this call's error, as CUDA reports it
}

}  // namespace commlib
