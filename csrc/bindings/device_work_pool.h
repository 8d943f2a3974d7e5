// The work handles of the C++ entry's async device calls, reused (issue #37, item 2): a steady
// async call through bindings/device_call_cache.h allocates nothing. A handle returned to Python is
// a pybind11 object holding a stream/device_work.h DeviceWork; making one per call cost two heap
// allocations (the DeviceWork and pybind11's registration of the new Python object in its instance
// map). The pool keeps the handles it made, and a call re-arms one that nothing else holds
// (StreamEngine::collective_into, DeviceWork::rearm) instead of making one.
//
// Free: its Python object's only reference is the pool's (no caller, no torch Work, no list of the
// user's holds it) and its DeviceWork's only owners are the pool and that object (no C++ caller
// holds it). Neither count can rise behind the check: under the GIL nothing else can reach the
// Python object, and a new owner of the DeviceWork can only be made from an existing one. The call
// that takes a handle holds a new reference to it from then on, so another call (another thread,
// once the GIL is released for the enqueue) cannot take it too.
//
// Lifetimes: a handle holds its DeviceWork, which holds its engine, as any work does; so a handle
// that outlives its communicator (a caller keeping it past close) keeps what it reads alive. The
// pool itself holds nothing the engine holds (no cycle): the cache that owns it drops it when the
// route forgets its calls or closes, and a handle a caller still holds lives on without it.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "stream/device_work.h"

namespace commlib {

class DeviceWorkPool {
 public:
  // Handles kept at most: more held at once by the caller than this are made per call (as before).
  static constexpr size_t kMaxHandles = 64;

  DeviceWorkPool() { slots_.reserve(kMaxHandles); }  // (one allocation, with the cache)

  // A pooled handle nothing else holds, as a new reference the caller owns, and its work to
  // re-arm; {} when every pooled handle is held. Under the GIL.
  std::pair<pybind11::object, DeviceWork*> take() {
    const size_t n = slots_.size();
    for (size_t looked = 0; looked < n; ++looked) {
      Slot& s = slots_[next_];
      next_ = next_ + 1 == n ? 0 : next_ + 1;
      if (Py_REFCNT(s.handle.ptr()) == 1 && s.work.use_count() == 2) {
        // The last release of the DeviceWork by another owner (an acq_rel decrement) happens before
        // what the caller does with it now.
        std::atomic_thread_fence(std::memory_order_acquire);
        return {s.handle, s.work.get()};
      }
    }
    return {};
  }

  // The Python handle of a work made for a call (none was free); pooled while there is room.
  // Under the GIL.
  pybind11::object adopt(std::shared_ptr<DeviceWork> work) {
    pybind11::object handle = pybind11::cast(work);
    if (slots_.size() < kMaxHandles) slots_.push_back(Slot{handle, std::move(work)});
    return handle;
  }

  void clear() {  // under the GIL
    slots_.clear();
    next_ = 0;
  }
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    pybind11::object handle;            // the Python object (its holder owns `work` too)
    std::shared_ptr<DeviceWork> work;   // the pool's own reference
  };
  std::vector<Slot> slots_;
  size_t next_ = 0;  // where the next look starts (handles are let go of in about call order)
};

}  // namespace commlib
