// A buffer that names its own stream (a __cuda_array_interface__ of version 3: its "stream" is
// where the data is valid) in a call that runs on another stream (stream=): the call's stream waits
// on the buffer's before the call (issue #37; DeviceCallCache::own_wait_of, Entry::own).
//
// The interface's rule: "the consumer must ... synchronize on the stream ... e.g. by
// cudaStreamWaitEvent on an event recorded on the provided stream" when it does not enqueue its
// work on that stream itself. A call naming no stream runs on the buffer's own (no wait needed: the
// stream orders it); one naming another stream records the device's wait event on the buffer's
// stream and makes its own stream wait on it: one record and one stream wait per call, on the host
// and nothing on the device's critical path (the copy of the event's state is the wait's). One
// event per device serves every such call: CUDA's stream wait takes the event's most recent record
// at the time of the wait, and the record and the wait are both made under the GIL, so two calls
// never interleave their pairs.
//
// Inside a graph capture (the call's stream capturing, the buffer's not): CUDA refuses a capturing
// stream's plain wait on an event recorded outside the capture (cudaErrorStreamCaptureIsolation,
// which invalidates the capture); the wait is then an external event wait node
// (cudaEventWaitExternal), on an event of its own that the graph holds: the captured call, on every
// replay, comes after the buffer's stream's work as it was when the call was captured, which is
// what the call consumed; ordering later writes to the buffer before a replay is the caller's, as
// for every captured input (docs/gpu.md "Stream capture", the caller's part). The capture query this
// needs is the call's one (the engine is handed its answer), so an eager call costs what it did.
#include "bindings/device_call_cache.h"
#include "bindings/own_stream_wait.h"

namespace commlib {

CaptureStatus wait_for_own_stream(Device& d, DeviceStream& own, DeviceStream& stream, DeviceEvent& shared) {
  DeviceGuard g(d);
  const CaptureStatus capture = d.capture_status(stream);
  if (capture == CaptureStatus::None || d.capture_status(own) != CaptureStatus::None) {
    d.record(shared, own);
    d.wait_event(stream, shared);
    return capture;
  }
  std::shared_ptr<DeviceEvent> event = d.create_event();
  d.record(*event, own);
  d.wait_event_external(stream, *event);
  d.retain_in_capture(stream, std::move(event));
  return capture;
}

std::shared_ptr<DeviceEvent> DeviceCallCache::own_wait_event(BufferKind kind, int device, StreamEngine& engine) {
  std::shared_ptr<DeviceEvent>& event = own_events_[DeviceStreamKey{kind, device, 0}];
  if (!event) {
    DeviceGuard g(engine.device());
    event = engine.device().create_event();
  }
  return event;
}

bool DeviceCallCache::own_wait_of(const CallKey& k, BufferKind kind, int device, StreamEngine& engine,
                                  std::shared_ptr<DeviceStream>* own, std::shared_ptr<DeviceEvent>* event) {
  own->reset();
  event->reset();
  if (!k.own || k.own_stream == k.current_stream) return true;  // runs on the buffer's own stream
  std::shared_ptr<StreamEngine> own_engine;
  if (!streams_.find(DeviceStreamKey{kind, device, k.own_stream}, &own_engine, own)) return false;
  *event = own_wait_event(kind, device, engine);
  return true;
}

}  // namespace commlib
