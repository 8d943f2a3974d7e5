// The work handles of the C++ entry's async device calls, reused (issue #37, item 2): a steady
// async call through bindings/device_call_cache.h allocates nothing, and neither does a C++
// caller's (NativeWorkPool, below: the torch backend's CUDA tensors). A handle returned to Python is
// a pybind11 object holding a stream/device_work.h DeviceWork; making one per call cost two heap
// allocations (the DeviceWork and pybind11's registration of the new Python object in its instance
// map). The pool keeps the handles it made, and a call re-arms one that nothing else holds
// (StreamEngine::collective_into, DeviceWork::rearm) instead of making one.
//
// Free: its Python object's only reference is the pool's (no caller, no torch Work, no list of the
// user's holds it) and its DeviceWork's only owners are the pool and that object (no C++ caller
// holds it), and nothing observes the object (no weak reference, no attribute of its own: an
// observer would see it answer for another call; such a handle leaves the pool instead). Neither
// count can rise behind the check: under the GIL nothing else can reach the Python object (a weak
// reference's referent is read under the GIL too), and a new owner of the DeviceWork can only be
// made from an existing one. The call
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
#include <mutex>
#include <utility>
#include <vector>

#include "stream/device_work.h"

namespace commlib {

class DeviceWorkPool {
 public:
  // Handles kept at most: more held at once by the caller than this are made per call (as before).
  static constexpr size_t kMaxHandles = 64;

  DeviceWorkPool() { slots_.reserve(kMaxHandles); }  // (one allocation, with the cache)

  // A pooled handle nothing else holds or observes, as a new reference the caller owns, and its
  // work to re-arm; {} when every pooled handle is held. Under the GIL. A handle nobody holds but
  // somebody observes (a weak reference to it, or attributes of its own) is dropped from the pool
  // instead, so it dies as an unpooled one would and its observer never sees it answer for
  // another call (one per take, released when the pool is consistent again: a weakref callback may
  // run Python then, which may call in).
  std::pair<pybind11::object, DeviceWork*> take() {
    pybind11::object dropped;
    for (size_t looked = 0; looked < slots_.size();) {
      if (next_ >= slots_.size()) next_ = 0;
      Slot& s = slots_[next_];
      if (Py_REFCNT(s.handle.ptr()) == 1 && s.work.use_count() == 2) {
        if (!observed(s.handle.ptr())) {
          // The last release of the DeviceWork by another owner (an acq_rel decrement) happens
          // before what the caller does with it now.
          std::atomic_thread_fence(std::memory_order_acquire);
          next_ = next_ + 1 == slots_.size() ? 0 : next_ + 1;
          return {s.handle, s.work.get()};
        }
        if (!dropped) {  // out of the pool: the last slot takes its place (looked at next)
          dropped = std::move(s.handle);
          if (&s != &slots_.back()) s = std::move(slots_.back());
          slots_.pop_back();
          continue;
        }
      }
      next_ = next_ + 1 == slots_.size() ? 0 : next_ + 1;
      ++looked;
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

  // Whether anything can see `handle` besides its holders: a weak reference to it, or entries in
  // an instance dict (none today: the binding has no dynamic attributes, and the route's wrapper,
  // which has __slots__ only, is made per call). A dict this cannot read without making one
  // counts as observed.
  static bool observed(PyObject* handle) {
    PyTypeObject* t = Py_TYPE(handle);
    if (t->tp_weaklistoffset > 0 &&
        *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(handle) + t->tp_weaklistoffset) != nullptr)
      return true;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (t->tp_flags & Py_TPFLAGS_MANAGED_DICT) return true;
#endif
    if (t->tp_dictoffset > 0) {
      PyObject* dict = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(handle) + t->tp_dictoffset);
      return dict != nullptr && PyDict_GET_SIZE(dict) > 0;
    }
    return t->tp_dictoffset != 0;
  }

 private:
  struct Slot {
    pybind11::object handle;            // the Python object (its holder owns `work` too)
    std::shared_ptr<DeviceWork> work;   // the pool's own reference
  };
  std::vector<Slot> slots_;
  size_t next_ = 0;  // where the next look starts (handles are let go of in about call order)
};

// The works of C++ callers' device calls (the torch backend's CUDA tensors: DeviceCallCache::
// run_native, without the GIL), reused as the Python entry's handles are: a steady call re-arms a
// work whose only owner is the pool (the caller's c10d Work and its hold of the tensors let go of
// it) instead of making one. No Python object is involved: the shared_ptr's count is all there is
// to observe. Free: use_count() == 1 under the pool's lock; it cannot rise behind the check (a new
// owner can only be copied from an existing one, and the pool's is the only one), and the taker's
// copy, made under the lock, keeps every other caller from taking it too.
class NativeWorkPool {
 public:
  static constexpr size_t kMaxWorks = 64;  // more held at once than this are made per call

  NativeWorkPool() { works_.reserve(kMaxWorks); }

  // A pooled work nobody else owns (the caller's copy), or null when every one is owned.
  std::shared_ptr<DeviceWork> take() {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = works_.size();
    for (size_t looked = 0; looked < n; ++looked) {
      std::shared_ptr<DeviceWork>& w = works_[next_];
      next_ = next_ + 1 == n ? 0 : next_ + 1;
      if (w.use_count() == 1) {
        // The last release by another owner (an acq_rel decrement) happens before the re-arm.
        std::atomic_thread_fence(std::memory_order_acquire);
        return w;
      }
    }
    return nullptr;
  }

  // A work made for a call (none was free): pooled while there is room.
  void adopt(const std::shared_ptr<DeviceWork>& work) {
    std::lock_guard<std::mutex> lock(mu_);
    if (works_.size() < kMaxWorks) works_.push_back(work);
  }

  void clear() {
    std::vector<std::shared_ptr<DeviceWork>> gone;  // released after the lock (a work may hold the last engine)
    std::lock_guard<std::mutex> lock(mu_);
    gone.swap(works_);
    works_.reserve(kMaxWorks);
    next_ = 0;
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<DeviceWork>> works_;
  size_t next_ = 0;
};

}  // namespace commlib
