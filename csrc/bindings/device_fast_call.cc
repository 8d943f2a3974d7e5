// The latency path of a device all_reduce (issue #25, host cost): `_C.fast_device_all_reduce`,
// one METH_FASTCALL function that Communicator.all_reduce calls first for a blocking in-place call
// on the current stream. It reads the buffer itself (bindings/device_view.h), looks the call up
// in the route's DeviceCallCache and, on a hit, enqueues it on the engine: no Python in between.
//
// Why a cache and not checks in C++: the Python path (commlib/core/device_route.py) owns every
// check and error message. It adds a call here only after that call passed every check and ran;
// the key holds everything the checks looked at (kind, pointer, count, dtype, device, current
// stream, op, algorithm, premul_sum's scale), so a hit is a call the checks already accepted. A
// miss, an async call or any unusual argument answers NotImplemented: the Python path takes it
// and raises naming the argument. The route clears the cache wherever it drops its engines.
#include <Python.h>

#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "bindings/bindings.h"
#include "bindings/device_view.h"
#include "bindings/gil.h"
#include "host/communicator.h"
#include "stream/stream_engine.h"

namespace py = pybind11;

namespace commlib {

namespace {

struct CallKey {
  DeviceView buffer;
  RedOp op = RedOp::Sum;
  std::string algorithm;
  double scale = 0;  // premul_sum's; 0 for every other op

  bool operator==(const CallKey& o) const {
    const DeviceView &a = buffer, &b = o.buffer;
    return a.cuda == b.cuda && a.ptr == b.ptr && a.count == b.count && a.dtype == b.dtype && a.device == b.device &&
           a.stream == b.stream && op == o.op && algorithm == o.algorithm && scale == o.scale;
  }
};

struct CallKeyHash {
  size_t operator()(const CallKey& k) const {
    size_t h = std::hash<uintptr_t>()(k.buffer.ptr);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<int64_t>()(k.buffer.count));
    mix(std::hash<uintptr_t>()(k.buffer.stream));
    mix(static_cast<size_t>(k.buffer.dtype) * 31 + static_cast<size_t>(k.op) * 7 + k.buffer.device * 2 +
        k.buffer.cuda);
    mix(std::hash<std::string>()(k.algorithm));
    return h;
  }
};

// Entries before the cache starts over (as the Python route's other per-call caches).
constexpr size_t kMaxCached = 256;

PyObject* g_op_names[static_cast<int>(RedOp::kCount)] = {};
uint64_t g_offers = 0, g_hits = 0;  // under the GIL

bool parse_op(PyObject* s, RedOp* op) {
  for (int i = 0; i < static_cast<int>(RedOp::kCount); ++i)
    if (s == g_op_names[i] || PyUnicode_Compare(s, g_op_names[i]) == 0) return *op = static_cast<RedOp>(i), true;
  PyErr_Clear();
  return false;
}

// The key of a call's Python arguments; false (no error set) when they are not of the kind the
// cache holds (the Python path decides what they are).
bool key_of(PyObject* tensor, PyObject* op, PyObject* algorithm, PyObject* scale, CallKey* k) {
  if (!PyUnicode_CheckExact(op) || !PyUnicode_CheckExact(algorithm) || !parse_op(op, &k->op)) return false;
  if (k->op == RedOp::PremulSum) {
    if (!PyFloat_CheckExact(scale) && !PyLong_CheckExact(scale)) return false;
    k->scale = PyFloat_AsDouble(scale);
    if (PyErr_Occurred()) return PyErr_Clear(), false;
  } else if (scale != Py_None) {
    return false;
  }
  Py_ssize_t n = 0;
  const char* name = PyUnicode_AsUTF8AndSize(algorithm, &n);
  if (name == nullptr) return PyErr_Clear(), false;
  k->algorithm.assign(name, static_cast<size_t>(n));
  return device_view(tensor, &k->buffer);
}

}  // namespace

// Resolved in-place all_reduce calls of one device route, and the buffers of the calls it
// enqueued, held until their stream executed them (as the route's _pending).
class DeviceCallCache {
 public:
  struct Entry {
    std::shared_ptr<StreamEngine> engine;
    CollectiveCall call;
    std::shared_ptr<DeviceStream> stream;
  };

  ~DeviceCallCache() { clear(); }

  // After `tensor`'s call (every argument checked, enqueued on `stream` of `engine`): later calls
  // of the same key hit. False when the buffer is of no kind the cache reads or does not match.
  bool add(py::handle tensor, py::handle op, py::handle algorithm, py::handle scale,
           std::shared_ptr<StreamEngine> engine, const CollectiveCall& call, std::shared_ptr<DeviceStream> stream) {
    CallKey k;
    if (!key_of(tensor.ptr(), op.ptr(), algorithm.ptr(), scale.ptr(), &k)) return false;
    if (k.buffer.ptr != call.input || call.output != call.input || k.buffer.count != call.count ||
        k.buffer.dtype != call.dtype || k.op != call.op)
      return false;
    if (entries_.size() >= kMaxCached) entries_.clear();
    entries_[std::move(k)] = Entry{std::move(engine), call, std::move(stream)};
    return true;
  }

  // Forgets every call (the route aborted: its buffers stay held, the streams may still run them).
  void forget() { entries_.clear(); }

  // Forgets every call and the last engine, releases the held buffers (the route closed its engines).
  void clear() {
    entries_.clear();
    while (!pending_.empty()) {
      Py_XDECREF(pending_.front().second);
      pending_.pop_front();
    }
    last_engine = nullptr;
  }

  // Holds `refs` until `work` completed (every device call of the route, either path): one queue,
  // polled on every call, so buffers are released in call order whichever path ran the call.
  void hold(std::shared_ptr<DeviceWork> work, py::handle refs) {
    release_completed();
    pending_.emplace_back(std::move(work), refs.inc_ref().ptr());
  }

  size_t held() const { return pending_.size(); }

  size_t size() const { return entries_.size(); }

  // The fast call: None when enqueued, NotImplemented for the Python path, nullptr (error set)
  // when the engine raised.
  PyObject* run(PyObject* tensor, PyObject* op, PyObject* algorithm, PyObject* scale) {
    if (entries_.empty()) Py_RETURN_NOTIMPLEMENTED;
    CallKey k;
    if (!key_of(tensor, op, algorithm, scale, &k)) Py_RETURN_NOTIMPLEMENTED;
    const auto it = entries_.find(k);
    if (it == entries_.end()) Py_RETURN_NOTIMPLEMENTED;
    const Entry hit = it->second;  // a copy: another thread may clear the cache while the GIL is released
    try {
      release_completed();  // one event query per call; a device error raises (as the Python poll)
    } catch (...) {
      set_python_error(std::current_exception());
      return nullptr;
    }
    std::shared_ptr<DeviceWork> work;
    std::exception_ptr error;
    {
      ReleaseGil nogil;
      try {
        work = hit.engine->collective(hit.call, *hit.stream);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {
      set_python_error(error);
      return nullptr;
    }
    Py_INCREF(tensor);
    pending_.emplace_back(std::move(work), tensor);
    last_engine = hit.engine;
    ++g_hits;
    Py_RETURN_NONE;
  }

  std::shared_ptr<StreamEngine> last_engine;  // of the last call run here

 private:
  void release_completed() {
    while (!pending_.empty() && pending_.front().first->is_completed()) {
      Py_XDECREF(pending_.front().second);
      pending_.pop_front();
    }
  }

  std::unordered_map<CallKey, Entry, CallKeyHash> entries_;
  std::deque<std::pair<std::shared_ptr<DeviceWork>, PyObject*>> pending_;
};

namespace {

// fast_device_all_reduce(cache_address, tensor, op, algorithm, scale, async_op)
PyObject* fast_device_all_reduce(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  ++g_offers;
  if (nargs != 6 || args[5] != Py_False) Py_RETURN_NOTIMPLEMENTED;  // async: the route makes the work
  auto* cache = static_cast<DeviceCallCache*>(PyLong_AsVoidPtr(args[0]));
  if (cache == nullptr) {
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  return cache->run(args[1], args[2], args[3], args[4]);
}

PyMethodDef g_def = {
    "fast_device_all_reduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_device_all_reduce)),
    METH_FASTCALL,
    "fast_device_all_reduce(cache_address, tensor, op, algorithm, scale, async_op)\n"
    "A blocking in-place device all_reduce on the current stream, if its DeviceCallCache holds the call: None "
    "when enqueued, NotImplemented to ask for the Python path."};

}  // namespace

void bind_device_fast_call(py::module_& m) {
  for (int i = 0; i < static_cast<int>(RedOp::kCount); ++i)
    g_op_names[i] = PyUnicode_InternFromString(op_name(static_cast<RedOp>(i)));
  py::class_<DeviceCallCache, std::unique_ptr<DeviceCallCache>>(
      m, "DeviceCallCache", "Resolved in-place device all_reduce calls of one route (bindings/device_fast_call.cc).")
      .def(py::init<>())
      .def(
          "add",
          [](DeviceCallCache& c, py::handle tensor, py::handle op, py::handle algorithm, py::handle scale,
             std::shared_ptr<StreamEngine> engine, Collective coll, const std::string& algo, uintptr_t in,
             uintptr_t out, int64_t count, DType dtype, RedOp red, int root, double scale_value,
             std::shared_ptr<DeviceStream> stream) {
            if (coll != Collective::AllReduce || root != 0) return false;
            return c.add(tensor, op, algorithm, scale,
                         std::move(engine), collective_call(coll, algo, in, out, count, dtype, red, root, scale_value),
                         std::move(stream));
          },
          "add(tensor, op, algorithm, scale, engine, *engine.run's arguments): after the call ran, later calls of "
          "its key hit. False when the buffer is not of a kind the cache reads.")
      .def("clear", &DeviceCallCache::clear, "Forget every call and the last engine; release the buffers held.")
      .def("forget", &DeviceCallCache::forget, "Forget every call (the buffers stay held).")
      .def("hold", &DeviceCallCache::hold, py::arg("work"), py::arg("refs"),
           "Hold refs until work completed (polled on every call of either path).")
      .def("held", &DeviceCallCache::held, "Calls whose buffers are held (not seen completed yet).")
      .def("__len__", &DeviceCallCache::size)
      .def_readwrite("last_engine", &DeviceCallCache::last_engine, "The engine of the last call run (None before).")
      .def("address", [](DeviceCallCache& c) { return reinterpret_cast<uintptr_t>(&c); },
           "For fast_device_all_reduce (the caller keeps the cache alive).");
  m.def(
      "device_fast_path_counts", [] { return std::make_pair(g_offers, g_hits); },
      "(calls of fast_device_all_reduce, how many of them it ran) in this process, for tests.");
  PyObject* fn = PyCFunction_NewEx(&g_def, nullptr, m.ptr());
  if (!fn) throw py::error_already_set();
  m.add_object("fast_device_all_reduce", py::reinterpret_steal<py::object>(fn));
}

}  // namespace commlib
