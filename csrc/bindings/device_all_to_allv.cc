// all_to_all with split sizes through the C++ entry (DeviceCallCache::run_all_to_allv; issue #37
// items 1 and 2): the point-to-point batch the device route's p2p enqueues for it
// (commlib/core/communicator.py _all_to_allv, p2p_plan.py plan_all_to_allv, device_route.py p2p),
// built and enqueued here with no Python in between, on an engine the route set up.
//
// Why not a cached entry: the batch is a function of the buffers and the split sizes alone (no
// algorithm to resolve, no plan: the point-to-point path's chunks), so every call is a "new shape"
// whose checks are restated below: the Python path's (split_sizes, the overlap and own-block
// checks, one device, one dtype, a registered algorithm name); anything they would refuse or look
// at further (a split that is no int, a sequence that is not a list or tuple) answers
// NotImplemented, so the Python path raises naming the argument before anything is enqueued.
#include <exception>
#include <utility>

#include "bindings/bindings.h"
#include "bindings/call_names.h"
#include "bindings/device_call_cache.h"
#include "bindings/fast_call.h"
#include "bindings/gil.h"
#include "bindings/own_stream_wait.h"

namespace commlib {

uint64_t DeviceCallCounts::all_to_allv = 0;

namespace {

// `splits` (None: equal blocks) as `P` block sizes of `total` elements into `out`, as
// call_checks.py split_sizes reads them; false (no Python error set) for anything it would refuse
// (a count that does not split, a wrong length, a negative size, a wrong sum) or that is not a list
// or tuple of ints that are not bools (as_split_list: the Python path's to read and refuse).
bool read_splits(PyObject* splits, int64_t total, int P, int64_t* out) {
  if (splits == Py_None) {
    if (total % P) return false;
    for (int j = 0; j < P; ++j) out[j] = total / P;
    return true;
  }
  if (!PyList_Check(splits) && !PyTuple_Check(splits)) return false;
  if (PySequence_Fast_GET_SIZE(splits) != P) return false;
  PyObject** items = PySequence_Fast_ITEMS(splits);
  int64_t sum = 0;
  for (int j = 0; j < P; ++j) {
    if (!PyLong_Check(items[j]) || PyBool_Check(items[j])) return false;  // (True is no count: call_checks.py)
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(items[j], &overflow);
    if (overflow || v < 0 || (v == -1 && PyErr_Occurred())) return PyErr_Clear(), false;
    out[j] = v;
    sum += v;
    if (sum > total) return false;
  }
  return sum == total;
}

}  // namespace

bool plan_all_to_allv(int P, int me, const BufferView& in, const BufferView& out, PyObject* output_splits,
                      PyObject* input_splits, std::vector<int64_t>* splits, std::vector<P2PItem>* items,
                      AllToAllvOwnBlock* own) {
  splits->resize(2 * static_cast<size_t>(P));
  int64_t *ins = splits->data(), *outs = ins + P;
  if (!read_splits(input_splits, in.count, P, ins) || !read_splits(output_splits, out.count, P, outs)) return false;
  const int64_t es = static_cast<int64_t>(dtype_size(in.dtype));
  if (in.address < out.address + static_cast<uintptr_t>(out.count * es) &&
      out.address < in.address + static_cast<uintptr_t>(in.count * es))
    return false;  // "output: overlaps input"
  if (ins[me] != outs[me]) return false;  // "this rank sends itself ... but expects ..."
  // The messages (plan_all_to_allv's, in its order) and this rank's block to itself.
  items->clear();
  int64_t in_at = 0, out_at = 0;
  for (int j = 0; j < P; ++j) {
    if (j == me) {
      own->dst = out.address + static_cast<uintptr_t>(out_at * es);
      own->src = in.address + static_cast<uintptr_t>(in_at * es);
      own->bytes = static_cast<size_t>(ins[me] * es);
    } else {
      items->push_back(P2PItem{true, in.address + static_cast<uintptr_t>(in_at * es), ins[j], j});
      items->push_back(P2PItem{false, out.address + static_cast<uintptr_t>(out_at * es), outs[j], j});
    }
    in_at += ins[j];
    out_at += outs[j];
  }
  return true;
}

PyObject* DeviceCallCache::run_all_to_allv(PyObject* const* args, const BufferView& va, const BufferView& vb,
                                           PyObject* output_splits, PyObject* input_splits) {
  PyObject *a = args[2], *b = args[3], *async_op = args[7], *stream = args[9];
  // (no engine set up yet: the route's first call on the device sets one up)
  if (stream_of_.empty() || (async_op != Py_True && async_op != Py_False)) Py_RETURN_NOTIMPLEMENTED;
  // input and output on one device, of one dtype (the route's _one_device; all_to_all's TypeError)
  if (!on_device(va.kind) || vb.kind != va.kind || vb.device != va.device || vb.dtype != va.dtype)
    Py_RETURN_NOTIMPLEMENTED;
  if (parse_algorithm_name(Collective::AllToAll, args[5]) < 0) Py_RETURN_NOTIMPLEMENTED;  // (check_algorithm's)
  // (the batch's own vectors: the enqueue reads them with the GIL released, while another thread
  // may be in this method; the engine's p2p allocates per batch anyway)
  std::vector<int64_t> splits;
  std::vector<P2PItem> items;
  AllToAllvOwnBlock own_block;
  if (!plan_all_to_allv(size_, rank_, va, vb, output_splits, input_splits, &splits, &items, &own_block))
    Py_RETURN_NOTIMPLEMENTED;
  // stream=, read as the route's resolver reads it (named_stream.cc); its TypeError once every
  // other argument is one the Python path accepts.
  uintptr_t named = 0;
  if (stream != Py_None) {
    const NamedStream r = read_named_stream(va.kind, stream, &named);
    if (r == NamedStream::Unread) Py_RETURN_NOTIMPLEMENTED;
    if (r == NamedStream::WrongType) return raise_stream_type_error(va.kind, stream);
  }
  const auto resolver = stream_of_.find(DeviceStreamKey{va.kind, va.device, 0});
  if (resolver == stream_of_.end()) Py_RETURN_NOTIMPLEMENTED;  // no engine on that device yet
  // The stream the batch runs on: stream=, else the input's own (a __cuda_array_interface__'s),
  // else the current one (the route's resolver of its first buffer, the input).
  const uintptr_t on = stream != Py_None ? named : va.stream;
  std::shared_ptr<StreamEngine> engine;
  std::shared_ptr<DeviceStream> dstream;
  if (!streams_.find(DeviceStreamKey{va.kind, va.device, on}, &engine, &dstream)) Py_RETURN_NOTIMPLEMENTED;
  CallKey k;  // (only its stream fields: own_wait_of's question)
  k.current_stream = on;
  k.own = va.own_stream;
  k.own_stream = va.own_stream ? va.stream : 0;
  std::shared_ptr<DeviceStream> own;
  std::shared_ptr<DeviceEvent> own_event;
  pybind11::object stream_of = resolver->second;
  try {
    if (!own_wait_of(k, va.kind, va.device, *engine, &own, &own_event)) Py_RETURN_NOTIMPLEMENTED;
    if (va.own_stream) stream_of = own_stream_resolver(own ? own : dstream, stream_of);
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
  release_completed();  // what the previous calls' enqueues retired (no device call)
  std::shared_ptr<DeviceWork> work;
  CaptureStatus capture = CaptureStatus::None;
  const CaptureStatus* known_capture = nullptr;  // (asked by the own stream's wait: the engine's answer)
  try {
    // Under the GIL: the device's one wait event is recorded and waited on by one call at a time.
    if (own_event) {
      capture = wait_for_own_stream(engine->device(), *own, *dstream, *own_event);
      known_capture = &capture;
    }
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
  if (!ran_released([&] {
        if (own_block.bytes) {
          DeviceGuard g(engine->device());
          engine->device().copy(reinterpret_cast<void*>(own_block.dst), reinterpret_cast<const void*>(own_block.src),
                                own_block.bytes, *dstream);
        }
        // numbered as a collective (its errors name all_to_all #n); va.count: what this rank sends
        work = engine->all_to_allv(items, va.dtype, va.count, *dstream, known_capture);
      }))
    return nullptr;
  ++DeviceCallCounts::all_to_allv;
  // Held until the batch completed, in call order with every other call of the route (hold()),
  // after releasing what the enqueue's begin() retired: a work held past its completion holds its
  // event, which the engine's pool then cannot reuse (an event created per call).
  release_completed();
  Py_INCREF(a);
  Py_INCREF(b);
  pending_.push_back(Held{work, nullptr, 0, a, b});
  if (async_op == Py_False) Py_RETURN_NONE;
  try {
    return make_work_(pybind11::cast(work), pybind11::make_tuple(pybind11::handle(a), pybind11::handle(b)), stream_of)
        .release()
        .ptr();
  } catch (pybind11::error_already_set& e) {
    e.restore();
    return nullptr;
  }
}

PyObject* run_device_all_to_allv(DeviceCallCache& cache, PyObject* const* args, const BufferView& va,
                                 const BufferView& vb, PyObject* output_splits, PyObject* input_splits) {
  return cache.run_all_to_allv(args, va, vb, output_splits, input_splits);
}

}  // namespace commlib
