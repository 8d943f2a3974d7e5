// DeviceCallCache (bindings/device_call_cache.h): filling it (the route, after a call passed its
// checks), forgetting it, holding the route's buffers, and the Python entry's hit (fast_call.cc).
#include "bindings/device_call_cache.h"
#include "bindings/own_stream_wait.h"

#include <exception>
#include <utility>

#include "bindings/bindings.h"
#include "bindings/fast_call.h"
#include "bindings/gil.h"

namespace py = pybind11;

namespace commlib {

uint64_t DeviceCallCounts::offers = 0, DeviceCallCounts::hits = 0, DeviceCallCounts::new_shapes = 0;
std::atomic<uint64_t> DeviceCallCounts::native_offers{0}, DeviceCallCounts::native_hits{0},
    DeviceCallCounts::native_p2p{0}, DeviceCallCounts::native_new_shapes{0};
std::atomic<uint64_t> DeviceStreamCounts::wrapped{0};

bool DeviceCallCache::add(py::handle a, py::handle b, py::handle op, py::handle algorithm, py::handle root,
                          py::handle scale, py::handle stream, std::shared_ptr<StreamEngine> engine,
                          const CollectiveCall& call, std::shared_ptr<DeviceStream> device_stream,
                          py::object stream_of, py::handle compress) {
  BufferView va, vb;
  PyBufferHold ha, hb;
  const bool current = stream.is_none();
  uintptr_t named = 0;
  CallKey k;
  if (!read_buffer(a.ptr(), &va, &ha, current) || !read_buffer(b.ptr(), &vb, &hb, current) ||
      (!current && read_named_stream(va.kind != BufferKind::None ? va.kind : vb.kind, stream.ptr(), &named) !=
                       NamedStream::Ok) ||
      !key_of(size_, rank_, call.coll, op.ptr(), algorithm.ptr(), root.ptr(), scale.ptr(), current ? nullptr : &named,
              va, vb, &k, compress.ptr()))
    return false;
  const CollectiveCall& c = k.call;
  // (a compressed call's algorithm is the one Python resolved for the codec: the key keeps the requested one)
  if (c.coll != call.coll || (c.algo != call.algo && !k.codec) || c.input != call.input || c.output != call.output ||
      c.count != call.count || c.dtype != call.dtype ||
      (collective_reduces(c.coll) && (c.op != call.op || (c.op == RedOp::PremulSum && c.scale != call.scale))) ||
      (collective_has_root(c.coll) && c.root != call.root))
    return false;
  PreparedCall prepared = engine->prepare(call);
  // A buffer naming its own stream while the call runs on stream=: later calls wait on it too.
  std::shared_ptr<DeviceStream> own;
  std::shared_ptr<DeviceEvent> own_event;
  const BufferKind kind = k.kind_a != BufferKind::None ? k.kind_a : k.kind_b;
  const int device = k.kind_a != BufferKind::None ? k.device_a : k.device_b;
  if (k.own && k.own_stream != k.current_stream) {
    std::shared_ptr<StreamEngine> own_engine;
    // (the route ran the call: its resolver wrapped that stream, or the device wraps it now)
    if (!streams_.find(DeviceStreamKey{kind, device, k.own_stream}, &own_engine, &own)) return false;
    own_event = own_wait_event(kind, device, *engine);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!valid()) entries_.clear();
  if (entries_.size() >= kMaxCached) entries_.clear();
  tuning_ = tuning_generation();
  registry_ = registry_generation();
  // (whether current, named or the buffer's own: its identity names it)
  streams_.remember({kind, device, k.current_stream}, engine, device_stream);
  entries_[k] = Entry{std::move(engine),    std::move(prepared), std::move(device_stream),
                      std::move(stream_of), py::reinterpret_borrow<py::object>(compress),
                      std::move(own),       std::move(own_event)};
  return true;
}

void DeviceCallCache::add_engine(BufferKind kind, int device, std::shared_ptr<StreamEngine> engine,
                                 DeviceP2PStreams::Wrap wrap, py::object stream_of) {
  streams_.add_engine(kind, device, std::move(engine), std::move(wrap));
  stream_of_[DeviceStreamKey{kind, device, 0}] = std::move(stream_of);
}

void DeviceCallCache::forget() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
    new_shapes_.clear();
    streams_.clear();
  }
  stream_of_.clear();
  own_events_.clear();
  works_.clear();
  native_works_.clear();
}

void DeviceCallCache::clear() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
    new_shapes_.clear();
    streams_.clear();
  }
  stream_of_.clear();
  own_events_.clear();
  while (!pending_.empty()) pop_held();
  works_.clear();
  native_works_.clear();
  last_engine = nullptr;
}

void DeviceCallCache::hold(std::shared_ptr<DeviceWork> work, py::handle refs) {
  release_completed();
  pending_.push_back(Held{std::move(work), nullptr, 0, refs.inc_ref().ptr(), nullptr});
}

PyObject* DeviceCallCache::run(Collective coll, PyObject* const* args, const BufferView& va, const BufferView& vb,
                               PyObject* compress) {
  ++DeviceCallCounts::offers;
  PyObject *a = args[2], *b = args[3], *async_op = args[7], *stream = args[9];
  // (no engine set up yet: the route's first call on the device sets one up)
  if ((entries_.empty() && stream_of_.empty()) || (async_op != Py_True && async_op != Py_False))
    Py_RETURN_NOTIMPLEMENTED;
  if (!entries_.empty() && !valid()) {  // a new tuning table or algorithm: what the entries resolved may have changed
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
  }
  // stream=, read as the route's resolver reads it (bindings/named_stream.cc): keyed by the
  // stream's identity, however it is spelt.
  uintptr_t named = 0;
  const NamedStream named_read = stream == Py_None ? NamedStream::Ok
                                                   : read_named_stream(on_device(va.kind) ? va.kind : vb.kind, stream,
                                                                       &named);
  if (named_read == NamedStream::Unread) Py_RETURN_NOTIMPLEMENTED;
  CallKey k;
  if (!key_of(size_, rank_, coll, args[4], args[5], args[6], args[8], stream == Py_None ? nullptr : &named, va, vb,
              &k, compress))
    Py_RETURN_NOTIMPLEMENTED;
  if (named_read == NamedStream::WrongType) {
    // Every other argument is one the Python path accepts (key_of), the buffers on one device as
    // its _one_device wants them: its resolver's error, raised here before anything is enqueued.
    if (k.kind_b != BufferKind::None && (k.kind_b != k.kind_a || k.device_b != k.device_a))
      Py_RETURN_NOTIMPLEMENTED;
    return raise_stream_type_error(on_device(va.kind) ? va.kind : vb.kind, stream);
  }
  // (no lock: every writer of entries_ holds the GIL, as this reader does)
  const auto it = entries_.find(k);
  std::optional<Entry> fresh;  // a new shape, kept among the entries once it ran
  uint64_t tuning = 0, registry = 0;
  if (it == entries_.end()) {
    tuning = tuning_generation();
    registry = registry_generation();
    try {
      if (!prepare_new_shape(k, &fresh)) Py_RETURN_NOTIMPLEMENTED;
    } catch (...) {
      set_python_error(std::current_exception());
      return nullptr;
    }
  }
  // A copy: another thread may clear the cache while the GIL is released.
  const Entry hit = fresh ? *fresh : it->second;
  release_completed();           // what the previous calls' enqueues retired (no device call)
  // A blocking call makes no work handle: its buffers are held by the engine's ordinal of the
  // call, released once the engine retired it. An async call re-arms a pooled handle nothing
  // else holds (device_work_pool.h; taken before the GIL is released, so no other call takes it),
  // else makes one: no allocation per steady call either way (issue #37, item 2).
  const bool blocking = async_op == Py_False;
  std::pair<py::object, DeviceWork*> reused;
  if (!blocking) reused = works_.take();
  std::shared_ptr<DeviceWork> made;
  uint64_t ordinal = 0;
  CaptureStatus capture = CaptureStatus::None;
  const CaptureStatus* known_capture = nullptr;
  try {
    // The buffer's own stream first, when the call runs on another (device_own_stream.cc): under
    // the GIL, so that no other call records the device's wait event between this record and wait.
    // It asks the call's capture query (a capturing stream waits through an external event node),
    // whose answer the engine takes.
    if (hit.own_event) {
      capture = wait_for_own_stream(hit.engine->device(), *hit.own, *hit.stream, *hit.own_event);
      known_capture = &capture;
    }
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
  if (!ran_released([&] {
        if (blocking)
          ordinal = hit.engine->collective_unhandled(hit.call, *hit.stream, known_capture);
        else if (reused.second)
          ordinal = hit.engine->collective_into(hit.call, *hit.stream, *reused.second, known_capture);
        else
          made = hit.engine->collective(hit.call, *hit.stream, known_capture);
      }))
    return nullptr;
  last_engine = hit.engine;
  ++DeviceCallCounts::hits;
  if (fresh) {
    // Kept once enqueued (a refused call adds nothing, as on the Python path), under the
    // generations read before prepare: a table changed meanwhile drops it at the next call.
    ++DeviceCallCounts::new_shapes;
    std::lock_guard<std::mutex> lock(mu_);
    if (tuning_ != tuning || registry_ != registry || entries_.size() >= kMaxCached) entries_.clear();
    tuning_ = tuning;
    registry_ = registry;
    entries_[k] = std::move(*fresh);
  }
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

PyObject* run_device_call(DeviceCallCache& cache, Collective coll, PyObject* const* args, const BufferView& va,
                          const BufferView& vb, PyObject* compress) {
  return cache.run(coll, args, va, vb, compress);
}

}  // namespace commlib
