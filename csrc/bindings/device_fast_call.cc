// The device half of the C++ entry (bindings/fast_call.cc): `DeviceCallCache`, the resolved device
// collectives of one communicator's device route, which the entry looks up and enqueues with no
// Python in between: every collective the route runs (all_reduce, all_gather, reduce_scatter,
// broadcast, reduce, all_to_all, gather, scatter), blocking or async_op=True (the entry returns
// the route's work handle), on the current stream or an explicit one.
//
// Why a cache and not checks in C++: the Python path (commlib/core/device_route.py) owns every
// check and error message. It adds a call here only after that call passed every check and was
// enqueued; the key holds everything the checks looked at (the call as fast_call.cc's call_of
// reads it from the arguments: collective, requested algorithm, addresses, count, dtype, op,
// root, premul_sum's scale; the buffers' kinds and devices; the current stream, or the stream
// object named), so a hit is a call the checks already accepted. A miss, or any unusual argument,
// answers NotImplemented: the Python path takes it and raises naming the argument.
//
// It also knows the streams calls ran on as current streams (device_p2p_streams.h): where the torch
// backend's CUDA sends and receives are enqueued from C++ (core_api.h device_p2p).
// The entry keeps what the call resolved (issue #37): the engine, its stream and the algorithm
// the kernel path's auto picks, its plan and its path (StreamEngine::prepare: no lookup per call). A new
// tuning table or algorithm registry drops every entry (one atomic load each per call).
#include <Python.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "bindings/bindings.h"
#include "bindings/device_p2p_streams.h"
#include "bindings/device_work_pool.h"
#include "bindings/fast_call.h"
#include "bindings/gil.h"
#include "common/ring_queue.h"
#include "host/communicator.h"
#include "policy/auto_policy.h"
#include "schedule/registry.h"
#include "stream/stream_engine.h"

namespace py = pybind11;

namespace commlib {

namespace {

struct CallKey {
  CollectiveCall call;  // as call_of reads it (the requested algorithm)
  BufferKind kind_a = BufferKind::None, kind_b = BufferKind::None;
  int device_a = -1, device_b = -1;
  uintptr_t current_stream = 0;  // the current stream's identity (no stream named)
  PyObject* stream = nullptr;    // the stream object named (the entry holds a reference)

  bool operator==(const CallKey& o) const {
    const CollectiveCall &x = call, &y = o.call;
    return x.coll == y.coll && x.algo == y.algo && x.input == y.input && x.output == y.output && x.count == y.count &&
           x.dtype == y.dtype && x.op == y.op && x.root == y.root && x.scale == y.scale && kind_a == o.kind_a &&
           kind_b == o.kind_b && device_a == o.device_a && device_b == o.device_b &&
           current_stream == o.current_stream && stream == o.stream;
  }
};

struct CallKeyHash {
  size_t operator()(const CallKey& k) const {
    size_t h = std::hash<uintptr_t>()(k.call.input);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<uintptr_t>()(k.call.output));
    mix(std::hash<int64_t>()(k.call.count));
    mix(std::hash<uintptr_t>()(k.current_stream ^ reinterpret_cast<uintptr_t>(k.stream)));
    mix(static_cast<size_t>(k.call.coll) * 131 + static_cast<size_t>(k.call.dtype) * 31 +
        static_cast<size_t>(k.call.op) * 7 + k.call.algo * 1009 + static_cast<size_t>(k.call.root) * 17 +
        static_cast<size_t>(k.device_a + 1) * 3);
    return h;
  }
};

// Entries before the cache starts over.
constexpr size_t kMaxCached = 256;

uint64_t g_offers = 0, g_hits = 0;  // under the GIL
// Calls offered by C++ callers without the GIL (run_device_call_native: the torch backend's CUDA
// tensors, through core_api.h) and how many of them ran.
std::atomic<uint64_t> g_native_offers{0}, g_native_hits{0};
std::atomic<uint64_t> g_native_p2p{0};  // point-to-point batches C++ callers enqueued (run_p2p_native)

// The key of one call through the entry; false when its arguments are not a plain call.
bool key_of(int P, int me, Collective coll, PyObject* op, PyObject* algorithm, PyObject* root, PyObject* scale,
            PyObject* stream, const BufferView& va, const BufferView& vb, CallKey* k) {
  if (!call_of(coll, P, me, op, algorithm, root, scale, va, vb, &k->call)) return false;
  // Both buffers on devices of one kind (the Python path explains mixtures).
  if (!on_device(va.kind) && va.kind != BufferKind::None) return false;
  if (!on_device(vb.kind) && vb.kind != BufferKind::None) return false;
  k->kind_a = va.kind;
  k->kind_b = vb.kind;
  k->device_a = va.device;
  k->device_b = vb.device;
  k->stream = stream == Py_None ? nullptr : stream;
  k->current_stream = stream == Py_None ? (va.kind != BufferKind::None ? va.stream : vb.stream) : 0;
  return true;
}

}  // namespace

class DeviceCallCache {
 public:
  struct Entry {
    std::shared_ptr<StreamEngine> engine;
    PreparedCall call;  // resolved once: algorithm, plan, path (StreamEngine::prepare)
    std::shared_ptr<DeviceStream> stream;
    py::object stream_of;    // the route's stream resolver, for the work handle
    py::object named_stream;  // keeps the key's stream object alive (its identity is the key)
  };

  // `size`, `rank`: the communicator's; `make_work(work, refs, stream_of)`: the route's work handle
  // class (commlib.core.device_route.DeviceWork).
  DeviceCallCache(int size, int rank, py::object make_work) : size_(size), rank_(rank), make_work_(std::move(make_work)) {}
  ~DeviceCallCache() { clear(); }

  // After a call (every argument checked, enqueued on `stream` of `engine` as `call`): later calls
  // of the same arguments hit. False when they are not of a kind the entry reads, or describe
  // another call than `call` (then nothing is added).
  bool add(py::handle a, py::handle b, py::handle op, py::handle algorithm, py::handle root, py::handle scale,
           py::handle stream, std::shared_ptr<StreamEngine> engine, const CollectiveCall& call,
           std::shared_ptr<DeviceStream> device_stream, py::object stream_of) {
    BufferView va, vb;
    PyBufferHold ha, hb;
    const bool current = stream.is_none();
    CallKey k;
    if (!read_buffer(a.ptr(), &va, &ha, current) || !read_buffer(b.ptr(), &vb, &hb, current) ||
        !key_of(size_, rank_, call.coll, op.ptr(), algorithm.ptr(), root.ptr(), scale.ptr(), stream.ptr(), va, vb, &k))
      return false;
    const CollectiveCall& c = k.call;
    if (c.coll != call.coll || c.algo != call.algo || c.input != call.input || c.output != call.output ||
        c.count != call.count || c.dtype != call.dtype ||
        (collective_reduces(c.coll) && (c.op != call.op || (c.op == RedOp::PremulSum && c.scale != call.scale))) ||
        (collective_has_root(c.coll) && c.root != call.root))
      return false;
    PreparedCall prepared = engine->prepare(call);
    std::lock_guard<std::mutex> lock(mu_);
    if (!valid()) entries_.clear();
    if (entries_.size() >= kMaxCached) entries_.clear();
    tuning_ = tuning_generation();
    registry_ = registry_generation();
    if (current)
      streams_.remember({k.kind_a != BufferKind::None ? k.kind_a : k.kind_b,
                         k.kind_a != BufferKind::None ? k.device_a : k.device_b, k.current_stream},
                        engine, device_stream);
    entries_[k] = Entry{std::move(engine), std::move(prepared), std::move(device_stream), std::move(stream_of),
                        py::reinterpret_borrow<py::object>(stream)};
    return true;
  }

  // Where C++ callers' point-to-point batches run (run_device_p2p_native; add_stream).
  DeviceP2PStreams& streams() { return streams_; }

  // Forgets every call (the route aborted: its buffers stay held, the streams may still run them).
  void forget() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      entries_.clear();
      streams_.clear();
    }
    works_.clear();
  }

  // Forgets every call and the last engine, releases the held buffers (the route closed its engines).
  void clear() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      entries_.clear();
      streams_.clear();
    }
    while (!pending_.empty()) pop_held();
    works_.clear();
    last_engine = nullptr;
  }

  // Holds `refs` until `work` completed (every device call of the route, either path): one queue,
  // polled on every call, so buffers are released in call order whichever path ran the call.
  void hold(std::shared_ptr<DeviceWork> work, py::handle refs) {
    release_completed();
    pending_.push_back(Held{std::move(work), nullptr, 0, refs.inc_ref().ptr(), nullptr});
  }

  size_t held() const { return pending_.size(); }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }

  // The same lookup for a caller without the GIL (the torch backend's C++ path, core_api.h's
  // device_collective): `k` built from its tensors as key_of would read them. Always enqueues with
  // a work handle (the caller holds its tensors until the work is known complete: nothing of
  // Python's is touched here). False when the cache holds no such call (nothing ran).
  bool run_native(const CallKey& k, std::shared_ptr<DeviceWork>* work) {
    g_native_offers.fetch_add(1, std::memory_order_relaxed);
    struct Hit {  // copies of what the call needs, never of the entry's Python objects
      std::shared_ptr<StreamEngine> engine;
      PreparedCall call;
      std::shared_ptr<DeviceStream> stream;
    };
    std::optional<Hit> hit;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (entries_.empty() || !valid()) return false;  // (the Python path drops stale entries)
      const auto it = entries_.find(k);
      if (it == entries_.end()) return false;
      hit.emplace(Hit{it->second.engine, it->second.call, it->second.stream});
    }
    *work = hit->engine->collective(hit->call, *hit->stream);
    g_native_hits.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  PyObject* run(Collective coll, PyObject* const* args, const BufferView& va, const BufferView& vb) {
    ++g_offers;
    PyObject *a = args[2], *b = args[3], *async_op = args[7], *stream = args[9];
    if (entries_.empty() || (async_op != Py_True && async_op != Py_False)) Py_RETURN_NOTIMPLEMENTED;
    if (!valid()) {  // a new tuning table or algorithm: what the entries resolved may have changed
      std::lock_guard<std::mutex> lock(mu_);
      entries_.clear();
      Py_RETURN_NOTIMPLEMENTED;
    }
    CallKey k;
    if (!key_of(size_, rank_, coll, args[4], args[5], args[6], args[8], stream, va, vb, &k))
      Py_RETURN_NOTIMPLEMENTED;
    // (no lock: every writer of entries_ holds the GIL, as this reader does)
    const auto it = entries_.find(k);
    if (it == entries_.end()) Py_RETURN_NOTIMPLEMENTED;
    const Entry hit = it->second;  // a copy: another thread may clear the cache while the GIL is released
    release_completed();  // what the previous calls' enqueues retired (no device call)
    // A blocking call makes no work handle: its buffers are held by the engine's ordinal of the
    // call, released once the engine retired it. An async call re-arms a pooled handle nothing
    // else holds (device_work_pool.h; taken before the GIL is released, so no other call takes it),
    // else makes one: no allocation per steady call either way (issue #37, item 2).
    const bool blocking = async_op == Py_False;
    std::pair<py::object, DeviceWork*> reused;
    if (!blocking) reused = works_.take();
    std::shared_ptr<DeviceWork> made;
    uint64_t ordinal = 0;
    std::exception_ptr error;
    {
      ReleaseGil nogil;
      try {
        if (blocking)
          ordinal = hit.engine->collective_unhandled(hit.call, *hit.stream);
        else if (reused.second)
          ordinal = hit.engine->collective_into(hit.call, *hit.stream, *reused.second);
        else
          made = hit.engine->collective(hit.call, *hit.stream);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {
      set_python_error(error);
      return nullptr;
    }
    last_engine = hit.engine;
    ++g_hits;
    release_completed();  // after the enqueue: its begin() retired what completed before it
    Py_INCREF(a);
    Py_XINCREF(b == Py_None ? nullptr : b);
    // The queue owns these references; the call's buffers are held by its ordinal, async or not
    // (a made work's own number: its ordinal, 0 when captured), never by the handle.
    if (made) ordinal = made->known_complete() ? 0 : made->seq();
    pending_.push_back(Held{nullptr, hit.engine, ordinal, a, b == Py_None ? nullptr : b});
    if (blocking) Py_RETURN_NONE;
    try {
      py::tuple refs = b == Py_None ? py::tuple(py::make_tuple(py::handle(a)))
                                    : py::tuple(py::make_tuple(py::handle(a), py::handle(b)));
      py::object handle = reused.second ? std::move(reused.first) : works_.adopt(std::move(made));
      return make_work_(handle, refs, hit.stream_of).release().ptr();
    } catch (py::error_already_set& e) {
      e.restore();
      return nullptr;
    }
  }

  std::shared_ptr<StreamEngine> last_engine;  // of the last call run here

 private:
  bool valid() const { return tuning_ == tuning_generation() && registry_ == registry_generation(); }

  // Releases the buffers of the calls their engine retired (seen complete): no device call here,
  // the engine's own poll (StreamEngine::begin, the watchdog) made it (issue #37).
  void release_completed() {
    while (!pending_.empty() && pending_.front().complete()) pop_held();
  }

  const int size_, rank_;
  py::object make_work_;
  // Held by every writer of entries_ (all of them under the GIL too) and by run_native, which
  // reads without the GIL (the torch backend's threads). Never held while taking the GIL.
  mutable std::mutex mu_;
  uint64_t tuning_ = 0, registry_ = 0;  // the generations the entries were resolved under
  std::unordered_map<CallKey, Entry, CallKeyHash> entries_;
  DeviceP2PStreams streams_;  // the streams calls ran on as current streams (point-to-point from C++)
  // A call's work (async calls and the Python path's) or its engine and ordinal (blocking calls
  // here), and the buffers it holds (no tuple made per blocking call).
  struct Held {
    std::shared_ptr<DeviceWork> work;
    std::shared_ptr<StreamEngine> engine;
    uint64_t seq = 0;
    PyObject* a = nullptr;
    PyObject* b = nullptr;
    bool complete() const { return work ? work->known_complete() : engine->retired(seq); }
  };
  void pop_held() {
    Held& h = pending_.front();
    Py_XDECREF(h.a);
    Py_XDECREF(h.b);
    h.a = h.b = nullptr;
    pending_.pop_front();
  }
  RingQueue<Held> pending_;  // (a ring: no allocation per call in a steady state)
  DeviceWorkPool works_;     // async calls' handles, reused (under the GIL)
};

PyObject* run_device_call(DeviceCallCache& cache, Collective coll, PyObject* const* args, const BufferView& va,
                          const BufferView& vb) {
  return cache.run(coll, args, va, vb);
}

bool run_device_call_native(DeviceCallCache& cache, const CollectiveCall& call, BufferKind kind_in,
                            BufferKind kind_out, int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work) {
  CallKey k;
  k.call = call;
  k.kind_a = kind_in;
  k.kind_b = kind_out;
  k.device_a = kind_in == BufferKind::None ? -1 : device;
  k.device_b = kind_out == BufferKind::None ? -1 : device;
  k.current_stream = stream;
  return cache.run_native(k, work);
}

bool run_device_p2p_native(DeviceCallCache& cache, const P2PItem* items, size_t n, DType dtype, BufferKind kind,
                           int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work) {
  if (!cache.streams().run(DeviceStreamKey{kind, device, stream}, std::vector<P2PItem>(items, items + n), dtype, work))
    return false;
  g_native_p2p.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// A named function the bench calls between its phases (bench/launch_cost.py): callgrind's
// --dump-before on it splits a run's instruction counts by phase. It does nothing.
__attribute__((noinline)) void callgrind_phase_mark() { __asm__ volatile(""); }

void bind_device_fast_call(py::module_& m) {
  py::class_<DeviceCallCache, std::unique_ptr<DeviceCallCache>>(
      m, "DeviceCallCache", "Resolved device collectives of one route, for the C++ entry (bindings/device_fast_call.cc).")
      .def(py::init<int, int, py::object>(), py::arg("size"), py::arg("rank"), py::arg("make_work"))
      .def(
          "add",
          [](DeviceCallCache& c, py::handle a, py::handle b, py::handle op, py::handle algorithm, py::handle root,
             py::handle scale, py::handle stream, std::shared_ptr<StreamEngine> engine, Collective coll,
             const std::string& algo, uintptr_t in, uintptr_t out, int64_t count, DType dtype, RedOp red, int root_value,
             double scale_value, std::shared_ptr<DeviceStream> device_stream, py::object stream_of) {
            if (algo == "nccl") return false;  // NCCL's own collective: the route makes its communicator first
            return c.add(a, b, op, algorithm, root, scale, stream, std::move(engine),
                         collective_call(coll, algo, in, out, count, dtype, red, root_value, scale_value),
                         std::move(device_stream), std::move(stream_of));
          },
          "add(a, b, op, algorithm, root, scale, stream, engine, *engine.run's arguments, stream_of): after the call "
          "ran, later calls of the same arguments (as the entry reads them) hit. False when not cacheable.")
      .def(
          "add_stream",
          [](DeviceCallCache& c, int kind, int device, std::shared_ptr<StreamEngine> engine,
             std::shared_ptr<DeviceStream> stream) {
            return c.streams().add_current(static_cast<BufferKind>(kind), device, std::move(engine), std::move(stream));
          },
          py::arg("kind"), py::arg("device"), py::arg("engine"), py::arg("stream"),
          "After a point-to-point batch on this thread's current stream of device kind:device (2 emulated, 3 "
          "CUDA): C++ callers' batches on that stream run on `engine`. False for a kind without a current stream.")
      .def("clear", &DeviceCallCache::clear, "Forget every call and the last engine; release the buffers held.")
      .def("forget", &DeviceCallCache::forget, "Forget every call (the buffers stay held).")
      .def("hold", &DeviceCallCache::hold, py::arg("work"), py::arg("refs"),
           "Hold refs until work completed (polled on every call of either path).")
      .def("held", &DeviceCallCache::held, "Calls whose buffers are held (not seen completed yet).")
      .def("__len__", &DeviceCallCache::size)
      .def_readwrite("last_engine", &DeviceCallCache::last_engine, "The engine of the last call run (None before).")
      .def("address", [](DeviceCallCache& c) { return reinterpret_cast<uintptr_t>(&c); },
           "For fast_collective (the caller keeps the cache alive).");
  m.def("callgrind_phase_mark", &callgrind_phase_mark,
        "Does nothing: bench/launch_cost.py calls it between phases, callgrind dumps before it.");
  m.def(
      "device_fast_path_counts", [] { return std::make_pair(g_offers, g_hits); },
      "(device calls offered to the C++ entry's cache, how many of them it ran) in this process, for tests.");
  m.def(
      "device_native_counts", [] { return std::make_pair(g_native_offers.load(), g_native_hits.load()); },
      "(device calls C++ callers offered the caches without Python: the torch backend's CUDA tensors; how many "
      "of them ran) in this process, for tests.");
  m.def(
      "device_native_p2p_count", [] { return g_native_p2p.load(); },
      "Point-to-point batches C++ callers (the torch backend's CUDA sends and receives) enqueued on a device "
      "stream without Python, in this process, for tests.");
}

}  // namespace commlib
