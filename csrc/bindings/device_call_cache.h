// `DeviceCallCache`: the resolved device collectives of one communicator's device route, which the
// C++ entry (bindings/fast_call.cc) looks up and enqueues with no Python in between: every
// collective the route runs (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
// gather, scatter), blocking or async_op=True (the entry returns the route's work handle), on the
// current stream, one named by stream= (read in C++: named_stream.cc) or the one a buffer names (a
// __cuda_array_interface__'s), compress= calls once the route ran one of them. Its methods: the Python entry's side in device_call_cache.cc,
// C++ callers' side without the GIL (the torch backend's CUDA tensors) in device_call_native.cc,
// the bindings in device_call_cache_bindings.cc; the key in device_call_key.h.
//
// Why a cache and not checks in C++: the Python path (commlib/core/device_route.py) owns every
// check and error message. It adds a call here only after that call passed every check and was
// enqueued; the key holds everything the checks looked at, so a hit is a call the checks already
// accepted. A miss on a stream of an engine the route set up is a new shape, checked as the Python
// path checks it and run here (device_call_new_shape.cc: for C++ callers, and for the Python entry
// on any stream, gather and scatter too; never a compress= call, whose codec Python checks); any
// other miss, or any unusual argument, answers NotImplemented: the Python path takes it and raises
// naming the argument (a stream= of a type the route's resolver refuses raises here, the same words).
//
// It also knows the streams calls ran on as current streams (device_p2p_streams.h): where the torch
// backend's CUDA sends and receives are enqueued from C++ (core_api.h device_p2p).
// The entry keeps what the call resolved (issue #37): the engine, its stream and the algorithm
// the kernel path's auto picks, its plan and its path (StreamEngine::prepare: no lookup per call). A new
// tuning table or algorithm registry drops every entry (one atomic load each per call).
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "bindings/device_call_key.h"
#include "bindings/device_p2p_streams.h"
#include "bindings/device_work_pool.h"
#include "common/ring_queue.h"
#include "policy/auto_policy.h"
#include "schedule/registry.h"
#include "stream/stream_engine.h"

namespace commlib {

// Calls offered to the caches in this process, for tests (device_call_cache_bindings.cc).
struct DeviceCallCounts {
  static uint64_t offers, hits;  // through the Python entry (under the GIL)
  // Of hits, the calls the Python entry resolved itself (a shape the Python path never ran, on an
  // engine the route set up: run's new-shape branch, device_call_new_shape.cc).
  static uint64_t new_shapes;
  // Offered by C++ callers without the GIL (run_device_call_native: the torch backend's CUDA
  // tensors), how many of them ran, and point-to-point batches they enqueued (run_p2p_native).
  static std::atomic<uint64_t> native_offers, native_hits, native_p2p;
  // Of native_hits, the calls C++ resolved itself (a shape the Python path never ran, on an engine
  // and stream it set up: run_native's new-shape branch, device_call_new_shape.cc).
  static std::atomic<uint64_t> native_new_shapes;
  // all_to_all with split sizes the Python entry ran itself (a point-to-point batch on an engine
  // the route set up: run_all_to_allv, device_all_to_allv.cc); apart from offers and hits.
  static uint64_t all_to_allv;
};

class DeviceCallCache {
 public:
  struct Entry {
    std::shared_ptr<StreamEngine> engine;
    PreparedCall call;  // resolved once: algorithm, plan, path (StreamEngine::prepare)
    std::shared_ptr<DeviceStream> stream;
    pybind11::object stream_of;  // the route's stream resolver (of the first buffer), for the work handle
    pybind11::object codec;      // the key's compress= object, held (its identity is the key's)
    // A buffer naming its own stream (a __cuda_array_interface__'s) while the call runs on another
    // (stream=): that stream, which the call's stream waits on before the call (CAI v3: the
    // consumer orders its work after the producer's stream), and the device's event for it
    // (own_wait_event). Null otherwise.
    std::shared_ptr<DeviceStream> own;
    std::shared_ptr<DeviceEvent> own_event;
  };

  // `size`, `rank`: the communicator's; `make_work(work, refs, stream_of)`: the route's work handle
  // class (commlib.core.device_route.DeviceWork).
  DeviceCallCache(int size, int rank, pybind11::object make_work)
      : size_(size), rank_(rank), make_work_(std::move(make_work)) {}
  ~DeviceCallCache() { clear(); }

  // After a call (every argument checked, enqueued on `stream` of `engine` as `call`): later calls
  // of the same arguments hit. False when they are not of a kind the entry reads, or describe
  // another call than `call` (then nothing is added).
  // `compress`: the call's compress= object (None: none); `call` then carries the codec it
  // resolved to and the algorithm the verifier accepted (auto resolved in Python: core/codecs.py).
  bool add(pybind11::handle a, pybind11::handle b, pybind11::handle op, pybind11::handle algorithm,
           pybind11::handle root, pybind11::handle scale, pybind11::handle stream, std::shared_ptr<StreamEngine> engine,
           const CollectiveCall& call, std::shared_ptr<DeviceStream> device_stream, pybind11::object stream_of,
           pybind11::handle compress = pybind11::none());

  // Where C++ callers' point-to-point batches run (run_device_p2p_native; add_stream).
  DeviceP2PStreams& streams() { return streams_; }

  // The route set up `engine` for device `kind`:`device` (under the GIL): calls on any stream of it
  // may run from C++ (`wrap`: device_p2p_streams.h), the Python entry's new shapes with the route's
  // stream resolver `stream_of` for their work handles.
  void add_engine(BufferKind kind, int device, std::shared_ptr<StreamEngine> engine, DeviceP2PStreams::Wrap wrap,
                  pybind11::object stream_of);

  // Forgets every call (the route aborted: its buffers stay held, the streams may still run them).
  void forget();
  // Forgets every call and the last engine, releases the held buffers (the route closed its engines).
  void clear();

  // Holds `refs` until `work` completed (every device call of the route, either path): one queue,
  // polled on every call, so buffers are released in call order whichever path ran the call.
  void hold(std::shared_ptr<DeviceWork> work, pybind11::handle refs);

  size_t held() const { return pending_.size(); }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }
  // Calls C++ callers resolved themselves (new shapes), kept for their later calls (the Python
  // entry's own new shapes are kept among its entries: size()).
  size_t new_shapes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return new_shapes_.size();
  }

  // The Python entry's lookup (fast_call.cc, under the GIL): None (blocking) or the work handle,
  // NotImplemented on a miss, nullptr with the error set when the engine raised or `stream=` is
  // of a type the route's resolver refuses (TypeError naming it, nothing enqueued). A miss on any
  // stream of a set-up engine (current, named or the buffer's own) is a new shape, run as C++
  // callers' are (prepare_new_shape) and kept among the entries.
  // `compress`: the call's compress= object (None: none; such calls hit only once the route added
  // them: a codec is checked and resolved in Python).
  PyObject* run(Collective coll, PyObject* const* args, const BufferView& va, const BufferView& vb,
                PyObject* compress = Py_None);

  // all_to_all with split sizes through the Python entry (device_all_to_allv.cc, under the GIL): the
  // point-to-point batch the route's p2p would enqueue (this rank's own block copied on the stream
  // first), on the current stream, a named one or the input's own, blocking or async, with the
  // route's work handle; NotImplemented for anything the Python path checks and explains (splits
  // it would refuse, overlapping buffers, an engine the route has not set up), nullptr with the
  // error set when the engine raised or `stream=` is of a type the resolver refuses.
  PyObject* run_all_to_allv(PyObject* const* args, const BufferView& va, const BufferView& vb,
                            PyObject* output_splits, PyObject* input_splits);

  // The same lookup for a caller without the GIL (the torch backend's C++ path, core_api.h's
  // device_collective; device_call_native.cc): `k` built from its tensors as key_of would read
  // them. Always enqueues with a work handle (the caller holds its tensors until the work is known
  // complete: nothing of Python's is touched here), a pooled one nobody owns re-armed where there
  // is one (NativeWorkPool). A call the Python path never ran (a new shape: other buffers, count,
  // dtype, op or root) on a stream whose engine the route set up and whose stream it wrapped
  // (streams_) is resolved here (run_new_shape) and kept for later calls. False when neither
  // applies, or the call has an argument the Python path explains (nothing ran).
  bool run_native(const CallKey& k, std::shared_ptr<DeviceWork>* work);

  std::shared_ptr<StreamEngine> last_engine;  // of the last call run here

 private:
  bool valid() const { return tuning_ == tuning_generation() && registry_ == registry_generation(); }

  // A C++ caller's entry resolved without Python (new_shapes_: never a Python object in it).
  struct NativeEntry {
    std::shared_ptr<StreamEngine> engine;
    PreparedCall call;
    std::shared_ptr<DeviceStream> stream;
  };
  // run_native's miss (device_call_new_shape.cc): the engine and wrapped stream the route set up
  // for `k`'s stream, the call checked as the Python path checks it, resolved (prepare) and enqueued;
  // kept in new_shapes_ once it was. False when the stream is not known or an argument is unusual.
  bool run_new_shape(const CallKey& k, std::shared_ptr<DeviceWork>* work);
  // The Python entry's miss (device_call_new_shape.cc, under the GIL): `*entry` resolved for `k` as
  // run_new_shape resolves it, on the stream the key names (current, named or the buffer's own),
  // with the route's stream resolver; false when the Python path must take the call (an argument
  // it explains, no engine on that device, a stream the device does not know). Throws what
  // prepare throws.
  bool prepare_new_shape(const CallKey& k, std::optional<Entry>* entry);
  // The work handles' stream resolver for a call whose first buffer names its own stream (the key's
  // own_stream, wrapped as `own`): wait(stream=None) orders that stream, any other argument goes
  // to the device's resolver `device_of`, as the route's resolver of such a buffer does.
  static pybind11::object own_stream_resolver(std::shared_ptr<DeviceStream> own, pybind11::object device_of);
  // The device event a call's stream waits on for a buffer's own stream (Entry::own_event): one per
  // device, made at its first use (under the GIL); recorded and waited on under the GIL, so no two
  // calls use it at once, and a wait takes the record made just before it (cudaStreamWaitEvent).
  std::shared_ptr<DeviceEvent> own_wait_event(BufferKind kind, int device, StreamEngine& engine);
  // The own stream of `k`'s first buffer when the call runs on another stream (`*own`, `*event`;
  // both null when there is nothing to wait on); false when the own stream is not one the device
  // knows (the Python path takes the call).
  bool own_wait_of(const CallKey& k, BufferKind kind, int device, StreamEngine& engine,
                   std::shared_ptr<DeviceStream>* own, std::shared_ptr<DeviceEvent>* event);
  // Enqueues `call` on `stream` of `engine` with a pooled work re-armed, else a new one (pooled).
  void enqueue_native(StreamEngine& engine, const PreparedCall& call, DeviceStream& stream,
                      std::shared_ptr<DeviceWork>* work);

  // Releases the buffers of the calls their engine retired (seen complete): no device call here,
  // the engine's own poll (StreamEngine::begin, the watchdog) made it (issue #37).
  void release_completed() {
    while (!pending_.empty() && pending_.front().complete()) pop_held();
  }

  static constexpr size_t kMaxCached = 256;  // entries (of either map) before it starts over
  const int size_, rank_;
  pybind11::object make_work_;
  // Held by every writer of entries_ (all of them under the GIL too) and by run_native, which
  // reads without the GIL (the torch backend's threads). Never held while taking the GIL.
  mutable std::mutex mu_;
  uint64_t tuning_ = 0, registry_ = 0;  // the generations the entries were resolved under
  std::unordered_map<CallKey, Entry, CallKeyHash> entries_;
  // The calls C++ callers resolved themselves (run_new_shape), under mu_ alone (written without the
  // GIL, so apart from entries_, which the Python entry reads under the GIL without mu_), and the
  // generations they were resolved under.
  std::unordered_map<CallKey, NativeEntry, CallKeyHash> new_shapes_;
  uint64_t new_tuning_ = 0, new_registry_ = 0;
  DeviceP2PStreams streams_;  // the streams calls ran on as current streams (point-to-point from C++)
  // (kind, device, 0) -> the route's stream resolver of that device (add_engine; under the GIL).
  std::unordered_map<DeviceStreamKey, pybind11::object, DeviceStreamKeyHash> stream_of_;
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
  RingQueue<Held> pending_;       // (a ring: no allocation per call in a steady state)
  DeviceWorkPool works_;          // async calls' handles, reused (under the GIL)
  // (kind, device, 0) -> own_wait_event's event (under the GIL).
  std::unordered_map<DeviceStreamKey, std::shared_ptr<DeviceEvent>, DeviceStreamKeyHash> own_events_;
  NativeWorkPool native_works_;   // C++ callers' works, reused (its own lock)
};

}  // namespace commlib
