// A device collective of a shape the Python path never ran (bindings/device_call_cache.h,
// run_new_shape for C++ callers, prepare_new_shape for the Python entry): the torch backend's CUDA
// tensors, or the Python communicator's buffers, whose buffers, count, dtype, op or root are new,
// the common case in training (fresh activations and gradients every step), enqueued with no Python.
//
// What a first call needs splits in three (docs/torch_backend.md, "What stays on the Python path"):
//   - once per (communicator, device): the engine's set-up (a rendezvous of every rank through the
//     store, the first call published for a peer in a host call to see). The Python route does it
//     and hands the engine to the cache (add_engine);
//   - once per stream: its wrapper as the engine's DeviceStream, made in C++ at the stream's first
//     call when no call of the route ran on it (device_p2p_streams.h);
//   - per shape: the argument checks, the resolution (algorithm, plan, path: StreamEngine::prepare)
//     and the enqueue. The checks are the Python path's (commlib/core/call_checks.py and the route),
//     restated below for a call whose buffers the caller already described (one dense buffer per
//     side on one device; gather's and scatter's through the Python entry: the root's whole buffer
//     and everyone's block), on the stream the key names (current, named, or the buffer's own): anything they would refuse, and algorithm="nccl" before NCCL's
//     communicator exists (the route makes it at the first such call), is declined here, so the caller hands it over and the Python path
//     raises its own message naming the argument, before anything is enqueued. Everything after
//     the checks is the engine's, on either path: each call's descriptor published and checked
//     against the peers' (MismatchError), a failed peer's PeerError, the capture rules
//     (stream_capture.cc: a capturing stream records the call, or refuses it naming the warm-up).
#include <stdexcept>
#include <utility>

#include "bindings/device_call_cache.h"
#include "plan/describe.h"

namespace commlib {

namespace {

// The collectives the route runs through StreamEngine::collective on buffers of one shape on every
// rank (gather and scatter differ per rank: the C++ callers run them as batches, device_lists.cc).
bool runs_as_one_call(Collective c) {
  switch (c) {
    case Collective::AllReduce:
    case Collective::Reduce:
    case Collective::Broadcast:
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
      return true;
    default:
      return false;
  }
}

// gather and scatter: through the Python entry the route runs them as one call of the engine
// (DeviceRoute.run, engine.run) whose buffers call_of read as the route does for this rank (the
// root's whole buffer, the others' block alone: common/shapes.h), so their new shapes run there
// too; C++ callers hand them over as batches (device_lists.cc).
bool rooted(Collective c) { return c == Collective::Gather || c == Collective::Scatter; }

// True when the Python path would accept `k` as it stands (call_checks.py's check_op and
// check_algorithm, the root's range, the route's one device); false for anything it would refuse
// or explain, which the caller then hands over. `rooted_too`: gather and scatter as well.
bool accepted_as_the_python_path_would(const CallKey& k, int size, bool rooted_too = false) {
  const CollectiveCall& c = k.call;
  if (!runs_as_one_call(c.coll) && !(rooted_too && rooted(c.coll))) return false;
  // (the route's first buffer: the input side's, else, scatter's off the root, the output's)
  const bool has_a = k.kind_a != BufferKind::None, has_b = k.kind_b != BufferKind::None;
  if (!on_device(has_a ? k.kind_a : k.kind_b)) return false;
  // all_gather, reduce_scatter and all_to_all take two buffers, broadcast one, all_reduce and
  // reduce one or two (out=), gather and scatter their block and the root's whole (call_of saw
  // to both); two of one kind on one device (the route's _one_device).
  const bool two = c.coll == Collective::AllGather || c.coll == Collective::ReduceScatter ||
                   c.coll == Collective::AllToAll;
  if ((two && !has_b) || (c.coll == Collective::Broadcast && has_b)) return false;
  if (!rooted(c.coll) && !has_a) return false;
  if (has_a && has_b && (k.kind_b != k.kind_a || k.device_b != k.device_a)) return false;
  if (c.count < 0 || c.dtype >= DType::kCount) return false;
  if (c.codec.active()) return false;  // compress=: the route's compressed call (never a C++ caller's today)
  if (collective_has_root(c.coll) ? c.root < 0 || c.root >= size : c.root != 0) return false;
  if (collective_reduces(c.coll)) {
    if (c.op >= RedOp::kCount || (op_is_bitwise(c.op) && !dtype_is_integer(c.dtype))) return false;
    if (c.op != RedOp::PremulSum && c.scale != 1.0) return false;  // (only premul_sum takes a scale)
  } else if (c.op != RedOp::Sum || c.scale != 1.0) {
    return false;  // (the Python path describes a data-movement call as "sum", scale 1)
  }
  if (c.algo == kNcclAlgorithmCode) {  // (whether its communicator exists: nccl_ready, below)
    if (collective_reduces(c.coll) && op_is_bitwise(c.op)) return false;  // the route: "NCCL has no band"
  } else if (c.algo != 0) {
    try {
      algorithm_name(c.coll, c.algo);  // registered (the Python side names an unknown one)
    } catch (const std::invalid_argument&) {
      return false;
    }
  }
  return true;
}

// An algorithm="nccl" call needs NCCL's communicator, which the route makes at the first such call
// (through the store: commlib/device/nccl_comm.py); later ones of any shape run here. (An aborted
// one is not ready either: the route raises the engine's error.)
bool nccl_ready(const CallKey& k, StreamEngine& engine) {
  return k.call.algo != kNcclAlgorithmCode || engine.nccl().ready();
}

}  // namespace

bool first_call_runs_from_cpp(const CollectiveCall& call, BufferKind kind_in, BufferKind kind_out, int device,
                              uintptr_t stream, int size) {
  return accepted_as_the_python_path_would(native_key_of(call, kind_in, kind_out, device, stream), size);
}

bool DeviceCallCache::prepare_new_shape(const CallKey& k, std::optional<Entry>* entry) {
  // (compress=: the codec is checked, and auto resolved under the verifier, in Python: core/codecs.py)
  if (k.codec != nullptr || !accepted_as_the_python_path_would(k, size_, true)) return false;
  const BufferKind kind = k.kind_a != BufferKind::None ? k.kind_a : k.kind_b;
  const int device = k.kind_a != BufferKind::None ? k.device_a : k.device_b;
  const auto resolver = stream_of_.find(DeviceStreamKey{kind, device, 0});
  if (resolver == stream_of_.end()) return false;  // no engine on that device: the route sets one up
  // The stream the key names (current, named or the buffer's own), wrapped now if no call ran on it.
  std::shared_ptr<StreamEngine> engine;
  std::shared_ptr<DeviceStream> stream;
  if (!streams_.find(DeviceStreamKey{kind, device, k.current_stream}, &engine, &stream) || !nccl_ready(k, *engine))
    return false;
  // An async call's work maps wait(stream=None) through the route's resolver of its first buffer:
  // the device's (the current stream), or for a buffer naming its own stream that one.
  // A buffer naming its own stream while the call runs on stream=: the call waits on it
  // (device_own_stream.cc).
  pybind11::object stream_of = resolver->second;
  std::shared_ptr<DeviceStream> own;
  std::shared_ptr<DeviceEvent> own_event;
  if (!own_wait_of(k, kind, device, *engine, &own, &own_event)) return false;
  if (k.own) stream_of = own_stream_resolver(own ? own : stream, stream_of);
  PreparedCall call = engine->prepare(k.call);  // (throws what the engine's plan throws)
  entry->emplace(Entry{std::move(engine), std::move(call), std::move(stream), std::move(stream_of), pybind11::none(),
                       std::move(own), std::move(own_event)});
  return true;
}

pybind11::object DeviceCallCache::own_stream_resolver(std::shared_ptr<DeviceStream> own, pybind11::object device_of) {
  pybind11::object own_obj = pybind11::cast(std::move(own));
  return pybind11::cpp_function([own_obj, device_of](pybind11::object stream) -> pybind11::object {
    return stream.is_none() ? own_obj : device_of(stream);
  });
}

bool DeviceCallCache::run_new_shape(const CallKey& k, std::shared_ptr<DeviceWork>* work) {
  if (!accepted_as_the_python_path_would(k, size_)) return false;
  std::shared_ptr<StreamEngine> engine;
  std::shared_ptr<DeviceStream> stream;
  if (!streams_.find(DeviceStreamKey{k.kind_a, k.device_a, k.current_stream}, &engine, &stream) ||
      !nccl_ready(k, *engine))
    return false;  // the engine not set up yet, or NCCL's communicator: the Python route's
  const uint64_t tuning = tuning_generation(), registry = registry_generation();
  NativeEntry entry{engine, engine->prepare(k.call), stream};  // (throws what the engine's plan throws)
  enqueue_native(*engine, entry.call, *stream, work);
  {
    // Kept once enqueued (a refused call adds nothing, as on the Python path), resolved under the
    // generations read before prepare: a table changed meanwhile drops it at the next call.
    std::lock_guard<std::mutex> lock(mu_);
    if (new_tuning_ != tuning || new_registry_ != registry || new_shapes_.size() >= kMaxCached) {
      new_shapes_.clear();
      new_tuning_ = tuning;
      new_registry_ = registry;
    }
    new_shapes_[k] = std::move(entry);
  }
  DeviceCallCounts::native_hits.fetch_add(1, std::memory_order_relaxed);
  DeviceCallCounts::native_new_shapes.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace commlib
