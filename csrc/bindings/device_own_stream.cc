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
#include "bindings/device_call_cache.h"

namespace commlib {

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
