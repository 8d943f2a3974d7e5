// The one C++ entry from Python: `_C.fast_collective`, a METH_FASTCALL function every collective
// method of Communicator (and the torch backend's latency path) calls first, with the user's
// objects as they are. It reads the buffers once (bindings/buffer_view.h: NumPy arrays, torch
// tensors, emulated arrays) and then
//   - host buffers: runs a collective (blocking on the caller's thread, GIL released; async_op=True
//     queued on the communicator's worker, answered with the Python path's Work handle), a
//     compress= one whose codec the Python path resolved before (host_compressed_calls.cc), and
//     all_to_all with split sizes (its point-to-point batch: device_all_to_allv.cc's plan);
//   - device buffers: looks the call up in the communicator's DeviceCallCache
//     (bindings/device_call_cache.h) and enqueues it on its stream engine, blocking or async,
//     on the current stream or the one named.
// Why: a small collective's own work is about a microsecond on the host and a kernel launch on a
// device; Python argument checks, pybind11's dispatch and string parsing cost as much again. The
// entry accepts only the unremarkable case and answers NotImplemented for anything else, so the
// Python method falls back to the general path, which owns every error message. It never raises
// for bad arguments; it raises only what the collective itself raises (CommError and subclasses).
#include "bindings/fast_call.h"

#include <cstring>
#include <exception>
#include <utility>

#include "bindings/bindings.h"
#include "bindings/call_names.h"
#include "bindings/gil.h"
#include "bindings/numpy_view.h"
#include "common/shapes.h"
#include "host/communicator.h"

namespace py = pybind11;

namespace commlib {

namespace {

constexpr int kFastCallColls = static_cast<int>(Collective::kCount);

// Calls of fast_collective in this process and how many it declined (for tests: which offers the
// latency path took; the GIL serialises the increments, one per call on the path it takes).
uint64_t g_offers = 0;
uint64_t g_declined = 0;
// Host calls the entry ran, by [async]: all_to_all with split sizes, and every other collective
// (compress= ones included): the tests' proof that async host calls no longer take Python.
uint64_t g_host_a2av[2] = {0, 0};
uint64_t g_host_runs[2] = {0, 0};

PyObject* fallback() {
  ++g_declined;
  Py_RETURN_NOTIMPLEMENTED;
}

bool has(const BufferView& v) { return v.kind != BufferKind::None; }

// The Python class of an async host call's handle (commlib.core.work.Work, registered by
// commlib/core/communicator.py: _C.set_host_work): what the Python path returns, so an async call
// through the entry answers with the same object, holding the same buffers. Never released (a
// class lives as long as the interpreter; no static destructor may run after it ended; a second
// set_host_work replaces it).
PyObject* g_host_work = nullptr;

// Runs `start` (the core's enqueue of a host call: blocking, it runs the call; async, it queues it
// on the communicator's worker and returns its Work) with the GIL released, as the Python path's
// Communicator.run / p2p / run_compressed bindings do: None for a blocking call, Work(work, (a, b))
// for an async one (the Python path's refs: the method's two buffers as given, b None where it took
// one), nullptr (the Python error set) when the enqueue or the blocking call raised.
template <class Start>
PyObject* run_host(bool async, PyObject* a, PyObject* b, Start&& start) {
  if (!async) return run_released([&] { start(false); });
  std::shared_ptr<Work> work;
  if (!ran_released([&] { work = start(true); })) return nullptr;
  try {
    py::object handle = py::cast(std::move(work));
    py::object refs = py::make_tuple(py::handle(a), py::handle(b));
    return PyObject_CallFunctionObjArgs(g_host_work, handle.ptr(), refs.ptr(), nullptr);
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  }
}

// An all_to_all with split sizes on host buffers, blocking or async: the batch the Python path's
// _all_to_allv runs (this rank's block copied at the call, then the messages through the
// executor), or NotImplemented for anything it checks and explains (device_all_to_allv.cc's plan).
PyObject* run_host_all_to_allv(Communicator& comm, PyObject* const* args, const BufferView& va, const BufferView& vb,
                               bool async) {
  if (va.kind != BufferKind::Host || vb.kind != BufferKind::Host || va.dtype != vb.dtype || args[11] != Py_None ||
      parse_algorithm_name(Collective::AllToAll, args[5]) < 0)
    return fallback();
  std::vector<int64_t> splits;
  std::vector<P2PItem> items;
  AllToAllvOwnBlock own;
  if (!plan_all_to_allv(comm.size(), comm.rank(), va, vb, args[12], args[13], &splits, &items, &own)) return fallback();
  ++g_host_a2av[async];
  int64_t sent = 0;  // the elements this rank sends (its input splits), what the call's errors count
  for (int p = 0; p < comm.size(); ++p) sent += splits[p];
  return run_host(async, args[2], args[3], [&](bool as_work) {
    if (own.bytes) std::memmove(reinterpret_cast<void*>(own.dst), reinterpret_cast<const void*>(own.src), own.bytes);
    return comm.all_to_allv(std::move(items), va.dtype, sent, as_work);
  });
}

}  // namespace

bool call_of(Collective coll, int P, int me, PyObject* op_obj, PyObject* algo_obj, PyObject* root_obj,
             PyObject* scale_obj, const BufferView& va, const BufferView& vb, CollectiveCall* out) {
  CollectiveCall call;
  call.coll = coll;
  if (collective_has_root(coll)) {
    int overflow = 0;
    const long root = PyLong_Check(root_obj) && !PyBool_Check(root_obj) ? PyLong_AsLongAndOverflow(root_obj, &overflow)
                                                                        : -1;
    if (overflow || root < 0 || root >= P) return PyErr_Clear(), false;
    call.root = static_cast<int>(root);
  }
  const int algo = parse_algorithm_name(coll, algo_obj);  // barrier's too: "auto" is the flags
  if (algo < 0) return false;
  call.algo = static_cast<uint8_t>(algo);
  if (collective_reduces(coll)) {
    if (!parse_op_name(op_obj, &call.op)) return false;
    if (call.op == RedOp::PremulSum) {
      if (!PyFloat_CheckExact(scale_obj) && !PyLong_CheckExact(scale_obj)) return false;
      call.scale = PyFloat_AsDouble(scale_obj);
      if (PyErr_Occurred()) return PyErr_Clear(), false;
    } else if (scale_obj != Py_None) {
      return false;
    }
  }
  // Which buffers must be there depends on the collective (and, for gather/scatter, on whether
  // this rank is the root: common/shapes.h).
  switch (coll) {
    case Collective::AllReduce:
    case Collective::Reduce:  // (tensor, out=None)
    case Collective::Broadcast:  // (tensor)
      if (!has(va) || (coll == Collective::Broadcast && has(vb))) return false;
      call.dtype = va.dtype;
      call.count = va.count;
      call.input = call.output = va.address;
      if (has(vb)) {
        if (vb.dtype != va.dtype || vb.count != va.count) return false;
        call.output = vb.address;
      }
      break;
    case Collective::AllGather:
    case Collective::Gather:  // a = input (the count), b = output (gather: root only)
    case Collective::ReduceScatter:
    case Collective::Scatter: {  // b = output (the count), a = input (scatter: root only)
      const bool by_input = coll == Collective::AllGather || coll == Collective::Gather;
      const BufferView &counted = by_input ? va : vb, &other = by_input ? vb : va;
      if (!has(counted)) return false;
      call.dtype = counted.dtype;
      call.count = counted.count;
      (by_input ? call.input : call.output) = counted.address;
      const auto shapes = buffer_shapes(coll, call.count, P, me, call.root);
      const int64_t other_elems = by_input ? shapes.output : shapes.input;  // < 0: not this rank's
      if (other_elems >= 0) {
        if (!has(other) || other.dtype != counted.dtype || other.count != other_elems) return false;
        (by_input ? call.output : call.input) = other.address;
      }
      break;
    }
    case Collective::AllToAll:  // equal blocks; in place (same buffer) is fine
      if (!has(va) || !has(vb) || va.dtype != vb.dtype || va.count != vb.count || va.count % P) return false;
      call.dtype = va.dtype;
      call.count = va.count / P;
      call.input = va.address;
      call.output = vb.address;
      break;
    case Collective::Barrier:
      if (has(va) || has(vb)) return false;
      call.dtype = DType::UInt8;
      break;
    default:
      return false;
  }
  if (op_is_bitwise(call.op) && collective_reduces(coll) && !dtype_is_integer(call.dtype)) return false;
  *out = call;
  return true;
}

namespace {

// fast_collective(core_address, collective, a, b, op, algorithm, root, async_op, scale
//                 [, stream, device_calls_address[, compress[, output_splits, input_splits]]])
PyObject* fast_collective(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  ++g_offers;
  if (nargs != 9 && nargs != 11 && nargs != 12 && nargs != 14) return fallback();
  PyObject* compress = nargs >= 12 ? args[11] : Py_None;
  // all_to_all's split sizes (all_to_allv: a point-to-point batch; None, None: equal blocks)
  const bool splits = nargs == 14 && (args[12] != Py_None || args[13] != Py_None);
  auto* comm = static_cast<Communicator*>(PyLong_AsVoidPtr(args[0]));
  const long coll_code = PyLong_AsLong(args[1]);
  if (!comm || coll_code < 0 || coll_code >= kFastCallColls || PyErr_Occurred()) {
    PyErr_Clear();
    return fallback();
  }
  const Collective coll = static_cast<Collective>(coll_code);
  PyObject* stream = nargs >= 11 ? args[9] : Py_None;
  // A device call's current stream is part of its key; without a device call cache (the torch
  // backend's host-only entry) there is nothing to key.
  const bool current_stream = nargs >= 11 && stream == Py_None;
  BufferView va, vb;
  PyBufferHold hold_a, hold_b;  // NumPy buffers, held while the call runs
  if (!read_buffer(args[2], &va, &hold_a, current_stream) || !read_buffer(args[3], &vb, &hold_b, current_stream))
    return fallback();
  if (on_device(va.kind) || on_device(vb.kind)) {
    void* cache = nargs >= 11 && args[10] != Py_None ? PyLong_AsVoidPtr(args[10]) : nullptr;
    if (cache == nullptr) return PyErr_Clear(), fallback();
    if (splits && (coll != Collective::AllToAll || compress != Py_None)) return fallback();
    PyObject* r = splits ? run_device_all_to_allv(*static_cast<DeviceCallCache*>(cache), args, va, vb, args[12],
                                                  args[13])
                         : run_device_call(*static_cast<DeviceCallCache*>(cache), coll, args, va, vb, compress);
    if (r == Py_NotImplemented) ++g_declined;
    return r;
  }
  // A stream on host buffers, an async_op that is no bool, an async call from a caller that takes
  // no Work (the torch backend's host entry: 9 arguments): the general path (it checks and explains).
  if (stream != Py_None || (args[7] != Py_False && args[7] != Py_True)) return fallback();
  const bool async = args[7] == Py_True;
  if (async && (nargs < 11 || g_host_work == nullptr)) return fallback();
  if (splits) return run_host_all_to_allv(*comm, args, va, vb, async);
  if (compress != Py_None) {  // a codec the Python path resolved before (host_compressed_calls.cc)
    CollectiveCall call;
    if (!host_compressed_call(*comm, coll, args, va, vb, compress, &call)) return fallback();
    ++g_host_runs[async];
    return run_host(async, args[2], args[3], [&](bool as_work) { return comm->collective(call, as_work); });
  }
  CollectiveCall call;
  if (!call_of(coll, comm->size(), comm->rank(), args[4], args[5], args[6], args[8], va, vb, &call)) return fallback();
  ++g_host_runs[async];
  return run_host(async, args[2], args[3], [&](bool as_work) { return comm->collective(call, as_work); });
}

PyMethodDef g_fast_def = {
    "fast_collective", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_collective)), METH_FASTCALL,
    "fast_collective(core_address, collective, a, b, op, algorithm, root, async_op, scale[, stream, device_calls"
    "[, compress[, output_splits, input_splits]]])\n"
    "The C++ entry: a collective on host buffers (async_op=True: answered with the class set_host_work set), or "
    "a device call its DeviceCallCache (device_calls: its address) holds. None (or the work of an async call) "
    "when it ran; NotImplemented asks for the general path."};

}  // namespace

void bind_host_compressed(py::module_& m);  // bindings/host_compressed_calls.cc

void bind_fast_call(py::module_& m) {
  init_call_names();
  bind_host_compressed(m);
  m.def(
      "core_address", [](Communicator& c) { return reinterpret_cast<uintptr_t>(&c); },
      "Address of a Communicator core, for fast_collective (the caller keeps the core alive).");
  m.def("numpy_reader_agrees", &numpy_reader_agrees,
        "Whether the entry's NumPy reader (bindings/numpy_view.h) was checked against the buffer protocol on its "
        "first array and agreed (False before the first array, or after a disagreement turned it off).");
  m.def(
      "fast_path_counts", [] { return std::make_pair(g_offers, g_declined); },
      "(calls of fast_collective, how many of them it declined) in this process, for tests.");
  m.def(
      "host_entry_counts",
      [] {
        py::dict d;
        d["blocking"] = g_host_runs[0];
        d["async"] = g_host_runs[1];
        d["all_to_allv_blocking"] = g_host_a2av[0];
        d["all_to_allv_async"] = g_host_a2av[1];
        return d;
      },
      "Host calls the C++ entry ran in this process, blocking and async (all_to_all with split sizes apart), "
      "for tests.");
  m.def(
      "set_host_work",
      [](py::object cls) {
        Py_XDECREF(g_host_work);
        g_host_work = cls.release().ptr();
      },
      py::arg("work_class"),
      "The class an async host call's handle is made of (commlib.core.work.Work, called with the core's Work and "
      "the call's buffers): the C++ entry runs async host calls once it is set.");
  PyObject* fn = PyCFunction_NewEx(&g_fast_def, nullptr, m.ptr());
  if (!fn) throw py::error_already_set();
  m.add_object("fast_collective", py::reinterpret_steal<py::object>(fn));
}

}  // namespace commlib
