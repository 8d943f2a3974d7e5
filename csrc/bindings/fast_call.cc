// The latency path from Python: one METH_FASTCALL function, `_C.fast_collective`, that takes the
// user's NumPy arrays and argument objects as they are and runs a blocking collective.
//
// Why: a small collective's own work is about a microsecond, and the general path (Python argument
// checks, pybind11's dispatcher, string parsing) cost as much again. This function accepts only the
// unremarkable case (exact numpy.ndarray buffers, writable, C-contiguous, matching sizes and dtypes,
// known op and algorithm, blocking) and answers NotImplemented for anything else, so the Python
// method falls back to the general path, which owns every error message. It never raises for bad
// arguments; it raises only what the collective itself raises (CommError and subclasses).
#include <Python.h>

#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/buffer_view.h"
#include "bindings/gil.h"
#include "bindings/tensor_view.h"
#include "common/shapes.h"
#include "host/communicator.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {

namespace {

PyObject* g_array_type = nullptr;  // numpy.ndarray, registered by commlib.buffers at import
PyObject* g_auto = nullptr;        // interned "auto"
PyObject* g_op_names[static_cast<int>(RedOp::kCount)] = {};
std::vector<std::vector<PyObject*>> g_algo_names;  // interned, per collective, registry order
uint64_t g_algo_generation = ~uint64_t{0};         // registry_generation() g_algo_names is from

constexpr int kColls = static_cast<int>(Collective::kCount);

// Interned-pointer comparison first (string literals in user code are interned), then by value.
bool same_name(PyObject* s, PyObject* interned) {
  return s == interned || (PyUnicode_Check(s) && PyUnicode_Compare(s, interned) == 0);
}

bool parse_op_object(PyObject* s, RedOp* op) {
  for (int i = 0; i < static_cast<int>(RedOp::kCount); ++i)
    if (s == g_op_names[i]) return *op = static_cast<RedOp>(i), true;
  if (!PyUnicode_Check(s)) return false;
  for (int i = 0; i < static_cast<int>(RedOp::kCount); ++i)
    if (PyUnicode_Compare(s, g_op_names[i]) == 0) return *op = static_cast<RedOp>(i), true;
  PyErr_Clear();
  return false;
}

// The interned names of every collective's algorithms, re-read when the registry changed
// (commlib.register_algorithm / unregister_algorithm at run time): one atomic load per call.
void refresh_algorithm_names() {
  const uint64_t gen = registry_generation();
  if (gen == g_algo_generation) return;
  for (auto& names : g_algo_names)
    for (PyObject* n : names) Py_DECREF(n);
  g_algo_names.assign(kColls, {});
  for (int c = 0; c < kColls; ++c)
    for (const auto& name : algorithms(static_cast<Collective>(c)))
      g_algo_names[c].push_back(PyUnicode_InternFromString(name.c_str()));
  g_algo_generation = gen;
}

// 0 for auto, else 1-based registry index; -1 when unknown (the general path explains).
int parse_algorithm_object(Collective c, PyObject* s) {
  if (same_name(s, g_auto)) return 0;
  refresh_algorithm_names();
  const auto& names = g_algo_names[static_cast<int>(c)];
  for (size_t i = 0; i < names.size(); ++i)
    if (same_name(s, names[i])) return static_cast<int>(i) + 1;
  PyErr_Clear();
  return -1;
}

// An exact numpy.ndarray (subclasses and other buffer exporters take the general path).
bool is_array(PyObject* o) { return o != nullptr && Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(g_array_type); }

// Calls of fast_collective in this process and how many it declined (for tests: which offers the
// latency path took; the GIL serialises the increments, one per call on the path it takes).
uint64_t g_offers = 0;
uint64_t g_declined = 0;

PyObject* fallback() {
  ++g_declined;
  Py_RETURN_NOTIMPLEMENTED;
}

PyObject* g_tensor_type = nullptr;  // torch.Tensor, registered by commlib.torch
PyObject* g_strided = nullptr;      // torch.strided
PyObject* g_is_cpu = nullptr;       // interned attribute and method names
PyObject* g_layout = nullptr;
PyObject* g_dtype = nullptr;
PyObject* g_is_contiguous = nullptr;
PyObject* g_data_ptr = nullptr;
PyObject* g_numel = nullptr;
std::vector<std::pair<PyObject*, DType>> g_torch_dtypes;

// A NumPy array or a torch tensor, as the core sees it.
struct Span {
  BufferView buffer;  // holds the NumPy buffer while the call runs
  uintptr_t addr = 0;
  int64_t count = 0;
  DType dtype = DType::UInt8;
};

bool span_of(PyObject* o, Span* s) {
  if (is_array(o)) {
    if (!s->buffer.acquire(o)) return false;
    s->addr = s->buffer.address();
    s->count = s->buffer.count;
    s->dtype = s->buffer.dtype;
    return true;
  }
  return tensor_view(o, &s->addr, &s->count, &s->dtype);
}

// New reference to o.name() or o.name; nullptr (error cleared) on failure.
PyObject* call0(PyObject* o, PyObject* name) {
  PyObject* r = PyObject_CallMethodObjArgs(o, name, nullptr);
  if (!r) PyErr_Clear();
  return r;
}


// fast_collective(core_address, collective, a, b, op, algorithm, root, async_op, scale)
//   a: the input-side array (all_reduce/broadcast/reduce: the tensor), b: the output-side array
//   or None. Returns None when the collective ran, NotImplemented to ask for the general path.
PyObject* fast_collective(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  ++g_offers;
  if (nargs != 9 || g_array_type == nullptr) return fallback();
  PyObject *a = args[2], *b = args[3], *op_obj = args[4], *algo_obj = args[5], *root_obj = args[6];
  if (args[7] != Py_False) return fallback();  // async_op: the general path makes the Work
  auto* comm = static_cast<Communicator*>(PyLong_AsVoidPtr(args[0]));
  const long coll_code = PyLong_AsLong(args[1]);
  if (!comm || coll_code < 0 || coll_code >= kColls || PyErr_Occurred()) {
    PyErr_Clear();
    return fallback();
  }
  const Collective coll = static_cast<Collective>(coll_code);
  const int P = comm->size(), me = comm->rank();

  CollectiveCall call;
  call.coll = coll;
  if (collective_has_root(coll)) {
    int overflow = 0;
    long root = PyLong_Check(root_obj) ? PyLong_AsLongAndOverflow(root_obj, &overflow) : -1;
    if (overflow || root < 0 || root >= P || PyBool_Check(root_obj)) return fallback();
    call.root = static_cast<int>(root);
  }
  if (coll != Collective::Barrier) {
    int algo = parse_algorithm_object(coll, algo_obj);
    if (algo < 0) return fallback();
    call.algo = static_cast<uint8_t>(algo);
  }
  if (collective_reduces(coll)) {
    if (!parse_op_object(op_obj, &call.op)) return fallback();
    if (call.op == RedOp::PremulSum) {
      if (!PyFloat_CheckExact(args[8]) && !PyLong_CheckExact(args[8])) return fallback();
      call.scale = PyFloat_AsDouble(args[8]);
      if (PyErr_Occurred()) return PyErr_Clear(), fallback();
    } else if (args[8] != Py_None) {
      return fallback();
    }
  }

  // Buffers: which objects must be arrays depends on the collective (and, for gather/scatter, on
  // whether this rank is the root).
  Span va, vb;
  auto view = [](PyObject* o, Span* v) { return o != nullptr && o != Py_None && span_of(o, v); };
  switch (coll) {
    case Collective::AllReduce:
    case Collective::Reduce: {  // (tensor, out=None)
      if (!view(a, &va)) return fallback();
      call.dtype = va.dtype;
      call.count = va.count;
      call.input = call.output = va.addr;
      if (b != Py_None) {
        if (!view(b, &vb) || vb.dtype != va.dtype || vb.count != va.count) return fallback();
        call.output = vb.addr;
      }
      break;
    }
    case Collective::Broadcast:
      if (!view(a, &va)) return fallback();
      call.dtype = va.dtype;
      call.count = va.count;
      call.input = call.output = va.addr;
      break;
    case Collective::AllGather:
    case Collective::Gather: {  // a = input (the count), b = output (shapes.h; gather: root only)
      if (!view(a, &va)) return fallback();
      call.dtype = va.dtype;
      call.count = va.count;
      call.input = va.addr;
      const int64_t out_elems = buffer_shapes(coll, call.count, P, me, call.root).output;
      if (out_elems >= 0) {
        if (!view(b, &vb) || vb.dtype != va.dtype || vb.count != out_elems) return fallback();
        call.output = vb.addr;
      }
      break;
    }
    case Collective::ReduceScatter:
    case Collective::Scatter: {  // b = output (the count), a = input (shapes.h; scatter: root only)
      if (!view(b, &vb)) return fallback();
      call.dtype = vb.dtype;
      call.count = vb.count;
      call.output = vb.addr;
      const int64_t in_elems = buffer_shapes(coll, call.count, P, me, call.root).input;
      if (in_elems >= 0) {
        if (!view(a, &va) || va.dtype != vb.dtype || va.count != in_elems) return fallback();
        call.input = va.addr;
      }
      break;
    }
    case Collective::AllToAll: {  // equal blocks; in place (same buffer) is fine
      if (!view(a, &va) || !view(b, &vb) || va.dtype != vb.dtype || va.count != vb.count || va.count % P)
        return fallback();
      call.dtype = va.dtype;
      call.count = va.count / P;
      call.input = va.addr;
      call.output = vb.addr;
      break;
    }
    case Collective::Barrier:
      call.dtype = DType::UInt8;
      break;
    default:
      return fallback();
  }
  if (op_is_bitwise(call.op) && collective_reduces(coll) && !dtype_is_integer(call.dtype)) return fallback();

  std::exception_ptr error;
  {
    ReleaseGil nogil;
    try {
      comm->collective(call, false);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    set_python_error(error);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef g_fast_def = {"fast_collective", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_collective)),
                          METH_FASTCALL,
                          "fast_collective(core_address, collective, a, b, op, algorithm, root, async_op, scale)\n"
                          "Blocking collective on plain NumPy arrays; NotImplemented asks for the general path."};

}  // namespace

bool tensor_view(PyObject* o, uintptr_t* address, int64_t* count, DType* dtype) {
  if (g_tensor_type == nullptr || Py_TYPE(o) != reinterpret_cast<PyTypeObject*>(g_tensor_type)) return false;
  bool ok = false;
  PyObject *cpu = nullptr, *layout = nullptr, *dt = nullptr, *contig = nullptr, *ptr = nullptr, *n = nullptr;
  do {
    if (!(cpu = PyObject_GetAttr(o, g_is_cpu)) || cpu != Py_True) break;
    if (!(layout = PyObject_GetAttr(o, g_layout)) || layout != g_strided) break;
    if (!(dt = PyObject_GetAttr(o, g_dtype))) break;
    bool known = false;
    for (const auto& [obj, code] : g_torch_dtypes)
      if (obj == dt) known = true, *dtype = code;
    if (!known) break;
    if (!(contig = call0(o, g_is_contiguous)) || contig != Py_True) break;
    if (!(ptr = call0(o, g_data_ptr)) || !(n = call0(o, g_numel))) break;
    *address = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(ptr));
    *count = PyLong_AsLongLong(n);
    ok = !PyErr_Occurred();
  } while (false);
  PyErr_Clear();
  Py_XDECREF(cpu);
  Py_XDECREF(layout);
  Py_XDECREF(dt);
  Py_XDECREF(contig);
  Py_XDECREF(ptr);
  Py_XDECREF(n);
  return ok;
}

void bind_fast_call(py::module_& m) {
  g_auto = PyUnicode_InternFromString("auto");
  for (int i = 0; i < static_cast<int>(RedOp::kCount); ++i)
    g_op_names[i] = PyUnicode_InternFromString(op_name(static_cast<RedOp>(i)));
  g_algo_names.assign(kColls, {});
  refresh_algorithm_names();

  m.def(
      "register_array_type",
      [](py::handle type) {
        if (!PyType_Check(type.ptr())) throw py::type_error("register_array_type: expected a type");
        Py_XDECREF(g_array_type);
        g_array_type = type.inc_ref().ptr();
      },
      "Tell the fast path which type is numpy.ndarray (commlib.buffers does, at import).");
  m.def(
      "register_torch_types",
      [](py::handle tensor_type, py::handle strided, py::dict dtypes) {
        if (!PyType_Check(tensor_type.ptr())) throw py::type_error("register_torch_types: expected torch.Tensor");
        g_torch_dtypes.clear();
        for (auto item : dtypes) {
          g_torch_dtypes.emplace_back(item.first.inc_ref().ptr(), py::cast<DType>(item.second));
        }
        g_strided = strided.inc_ref().ptr();
        g_is_cpu = PyUnicode_InternFromString("is_cpu");
        g_layout = PyUnicode_InternFromString("layout");
        g_dtype = PyUnicode_InternFromString("dtype");
        g_is_contiguous = PyUnicode_InternFromString("is_contiguous");
        g_data_ptr = PyUnicode_InternFromString("data_ptr");
        g_numel = PyUnicode_InternFromString("numel");
        g_tensor_type = tensor_type.inc_ref().ptr();
      },
      "Let the fast path take torch CPU tensors (commlib.torch does, at import): torch.Tensor, "
      "torch.strided and {torch dtype: _C.DType}.");
  m.def(
      "core_address", [](Communicator& c) { return reinterpret_cast<uintptr_t>(&c); },
      "Address of a Communicator core, for fast_collective (the caller keeps the core alive).");
  m.def(
      "fast_path_counts", [] { return std::make_pair(g_offers, g_declined); },
      "(calls of fast_collective, how many of them it declined) in this process, for tests.");
  PyObject* fn = PyCFunction_NewEx(&g_fast_def, nullptr, m.ptr());
  if (!fn) throw py::error_already_set();
  m.add_object("fast_collective", py::reinterpret_steal<py::object>(fn));
}

}  // namespace commlib
