// See event_pool.h.
#include "stream/event_pool.h"

namespace commlib {

std::shared_ptr<DeviceEvent> EventPool::take() {
  for (size_t tried = 0; tried < events_.size(); ++tried) {
    std::shared_ptr<DeviceEvent>& e = events_[next_];
    next_ = (next_ + 1) % events_.size();
    // use_count 1: only the pool holds it, and no one can get another reference but through the
    // pool, so the count cannot grow under us. No query (issue #37: one event query per call at
    // most): a record in flight always has a holder (its call's in-flight entry, retired only once
    // seen complete), and re-recording an event nobody waits on or queries is safe anyway.
    if (e.use_count() == 1) return e;
  }
  events_.push_back(device_.create_event());
  ++created_;
  next_ = 0;
  return events_.back();
}

}  // namespace commlib
