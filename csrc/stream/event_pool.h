// The stream engine's completion events, pooled (issue #25): a call used to create one event
// (cudaEventCreate, a few us of driver work) and drop it when its last holder went. The pool hands
// out an event that nobody but the pool holds any more (no call in flight, no work handle, not the
// engine's "previous call" event: so its last record completed, as a call's in-flight entry holds
// its event until seen complete), without querying it, and creates one only when none
// is free, so N calls create O(calls in flight) events, not N. Re-recording a free event is safe:
// nobody can wait on or query its previous record any more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "device/device.h"

namespace commlib {

class EventPool {
 public:
  explicit EventPool(Device& device) : device_(device) {}
  // A free event (see above), or a new one. The caller's device must be current.
  std::shared_ptr<DeviceEvent> take();
  // Events this pool created so far, and how many it holds now.
  uint64_t created() const { return created_; }
  size_t size() const { return events_.size(); }
  // Drops the pool's references (the engine's release): events still held elsewhere go with
  // their last holder.
  void clear() { events_.clear(); }

 private:
  Device& device_;
  std::vector<std::shared_ptr<DeviceEvent>> events_;
  size_t next_ = 0;  // round robin: the least recently handed out event is tried first
  uint64_t created_ = 0;
};

}  // namespace commlib
