// Device arrays that are not commlib's own, read in C++ on every call (issue #37, item 2): objects
// with __cuda_array_interface__ (CuPy, Numba, anything exporting CUDA memory that way) and DLPack
// exporters (__dlpack__ / __dlpack_device__) whose memory is on a CUDA device. The C++ entry
// (fast_call.cc) reads them through read_buffer with no Python in between but the producer's own
// methods, and the Python path (commlib/device/buffers.py) asks here too (_C.read_device_array),
// so one reader decides what such an array is and what is wrong with it.
//
// Where the memory is: the interface names no device, so __cuda_array_interface__ costs one
// pointer query per call (cudaPointerGetAttributes through commlib._C_cuda; memory the emulated
// device holds is found in its allocations, counted as the same query; without a usable
// commlib._C_cuda, device 0, which the device route then refuses with the reason); DLPack names
// its device (no query). What is refused, naming the argument: a non-contiguous layout, a dtype commlib does
// not move, read-only memory (the interface's readonly flag, DLPack 1.0's READ_ONLY flag) and a
// DLPack copy (IS_COPIED: results written there would not reach the caller's array), a mask, and
// memory on no device commlib reaches.
#include <pybind11/pybind11.h>

#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings/buffer_view.h"
#include "bindings/optional_attr.h"
#include "bindings/dlpack_abi.h"
#include "device/emulated/emulated_device.h"

namespace py = pybind11;

namespace commlib {

namespace {

using namespace dlpack;  // its ABI (bindings/dlpack_abi.h)

bool g_registered = false;  // register_foreign_dtypes ran (dtypes.py, at import)
PyObject* g_kwnames_full = nullptr;    // ("stream", "max_version")
PyObject* g_kwnames_stream = nullptr;  // ("stream",)
PyObject* g_max_version = nullptr;     // (1, 0)
std::unordered_map<std::string, DType> g_typestrs;  // commlib/device/dtypes.py's TYPESTR
std::map<std::pair<int, int>, DType> g_dlpack_dtypes;  // (code, bits) -> dtype
// How each exporter type's __dlpack__ takes its arguments (2: stream and max_version, 1: stream
// only, 0: none), learnt once per type: an older exporter raises TypeError for max_version.
std::vector<std::pair<PyObject*, int>> g_dlpack_kwargs;

// commlib._C_cuda's cudaPointerGetAttributes (its "pointer_device_fn" capsule), imported on the
// first CUDA pointer; null with the reason when commlib._C_cuda is not usable here.
using PointerDeviceFn = int (*)(uintptr_t);
PointerDeviceFn g_pointer_device = nullptr;
std::string g_no_cuda;

void problem(BufferProblem* why, PyObject* type, std::string message) {
  why->type = type;
  why->message = std::move(message);
}

// The pending Python error's text, cleared ("" when none).
std::string take_error_text() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* text = value ? PyObject_Str(value) : nullptr;
  const char* utf8 = text ? PyUnicode_AsUTF8(text) : nullptr;
  std::string out = utf8 ? utf8 : "";
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return out;
}

bool load_cuda_pointer_query() {
  if (g_pointer_device != nullptr) return true;
  if (!g_no_cuda.empty()) return false;
  PyObject* mod = PyImport_ImportModule("commlib._C_cuda");
  PyObject* cap = mod ? PyObject_GetAttrString(mod, "pointer_device_fn") : nullptr;
  void* fn = cap ? PyCapsule_GetPointer(cap, "commlib.pointer_device") : nullptr;
  if (fn == nullptr) {
    g_no_cuda = take_error_text();
    if (g_no_cuda.empty()) g_no_cuda = "commlib._C_cuda has no pointer query";
  } else {
    g_pointer_device = reinterpret_cast<PointerDeviceFn>(fn);
  }
  Py_XDECREF(cap);
  Py_XDECREF(mod);
  return g_pointer_device != nullptr;
}

// The device of memory at `ptr` that names none (__cuda_array_interface__).
bool locate(uintptr_t ptr, BufferView* v, BufferProblem* why) {
  const int emulated = emulated_device_of(reinterpret_cast<const void*>(ptr), true);
  if (emulated >= 0) {
    v->kind = BufferKind::Emulated;
    v->device = emulated;
    return true;
  }
  v->kind = BufferKind::Cuda;
  // An empty array (CuPy's have no pointer), or no CUDA here: device 0, and the device route
  // refuses the buffer with the reason when it looks for commlib._C_cuda.
  if (ptr == 0 || !load_cuda_pointer_query()) return v->device = 0, true;
  v->device = g_pointer_device(ptr);
  if (v->device < 0) {
    problem(why, PyExc_ValueError,
            "__cuda_array_interface__ points at memory no CUDA device holds (cudaPointerGetAttributes: host "
            "memory, or freed)");
    return false;
  }
  return true;
}

// Whether `strides` (null: none given) lay an array of `shape` out row-major, its elements side by
// side, an element `unit` of the strides' units (bytes: its size; elements: 1); a dimension of one
// element may step anywhere.
bool row_major(int ndim, const int64_t* shape, const int64_t* strides, int64_t unit) {
  if (strides == nullptr) return true;
  int64_t expected = unit;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool int_of(PyObject* o, long long* out) {
  if (!PyLong_Check(o)) return false;
  *out = PyLong_AsLongLong(o);
  return !PyErr_Occurred() || (PyErr_Clear(), false);
}

// A dict item, borrowed (null: absent or None).
PyObject* item(PyObject* dict, PyObject* key) {
  PyObject* r = PyDict_GetItemWithError(dict, key);
  return r == Py_None ? nullptr : r;
}

ForeignRead read_cai(PyObject* cai, BufferView* v, bool current_stream, BufferProblem* why) {
  if (!PyDict_Check(cai)) return problem(why, PyExc_TypeError, "__cuda_array_interface__ is not a dict"), ForeignRead::Bad;
  PyObject *data = item(cai, reader_name(kNameData)), *shape = item(cai, reader_name(kNameShape)),
           *typestr = item(cai, reader_name(kNameTypestr)), *strides = item(cai, reader_name(kNameStrides)),
           *stream = item(cai, reader_name(kNameStream)), *mask = item(cai, reader_name(kNameMask));
  if (PyErr_Occurred()) return PyErr_Clear(), problem(why, PyExc_TypeError, "unreadable __cuda_array_interface__"), ForeignRead::Bad;
  if (!data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 || !shape || !PyTuple_Check(shape) || !typestr ||
      !PyUnicode_Check(typestr) || (strides && !PyTuple_Check(strides)))
    return problem(why, PyExc_TypeError, "__cuda_array_interface__ lacks data, shape or typestr"), ForeignRead::Bad;
  const char* ts = PyUnicode_AsUTF8(typestr);
  const auto dt = ts ? g_typestrs.find(ts) : g_typestrs.end();
  if (dt == g_typestrs.end())
    return PyErr_Clear(), problem(why, PyExc_TypeError, std::string("unsupported CUDA array typestr '") + (ts ? ts : "?") + "'"),
           ForeignRead::Bad;
  if (mask) return problem(why, PyExc_ValueError, "masked CUDA arrays are not supported"), ForeignRead::Bad;
  const int ndim = static_cast<int>(PyTuple_GET_SIZE(shape));
  if (strides && PyTuple_GET_SIZE(strides) != ndim)
    return problem(why, PyExc_TypeError, "__cuda_array_interface__'s strides do not match its shape"), ForeignRead::Bad;
  int64_t dims[64], steps[64];
  if (ndim > 64) return problem(why, PyExc_ValueError, "more than 64 dimensions"), ForeignRead::Bad;
  int64_t count = 1;
  for (int i = 0; i < ndim; ++i) {
    long long n = 0, s = 0;
    if (!int_of(PyTuple_GET_ITEM(shape, i), &n) || n < 0 || (strides && !int_of(PyTuple_GET_ITEM(strides, i), &s)))
      return problem(why, PyExc_TypeError, "__cuda_array_interface__'s shape or strides are not integers"), ForeignRead::Bad;
    dims[i] = n;
    steps[i] = s;
    count *= n;
  }
  if (!row_major(ndim, dims, strides ? steps : nullptr, dtype_size(dt->second)))
    return problem(why, PyExc_ValueError, "CUDA array must be C-contiguous"), ForeignRead::Bad;
  long long ptr = 0;
  if (!int_of(PyTuple_GET_ITEM(data, 0), &ptr))
    return problem(why, PyExc_TypeError, "__cuda_array_interface__'s data pointer is not an integer"), ForeignRead::Bad;
  const int readonly = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
  if (readonly != 0)
    return PyErr_Clear(), problem(why, PyExc_ValueError, "CUDA array is read-only (a collective writes its buffers)"),
           ForeignRead::Bad;
  long long named_stream = 0;
  if (stream && (!int_of(stream, &named_stream) || named_stream < 0))
    return problem(why, PyExc_TypeError, "__cuda_array_interface__'s stream is not a stream handle (an int >= 0)"),
           ForeignRead::Bad;
  if (!locate(static_cast<uintptr_t>(ptr), v, why)) return ForeignRead::Bad;
  v->address = static_cast<uintptr_t>(ptr);
  v->count = count;
  v->dtype = dt->second;
  // The stream the data is valid on (version 3's "stream"): the consumer must order its work after
  // that stream's. The call runs on it (unless it names its own stream=, which then waits on it:
  // device_own_stream.cc), as the Python path's resolver does. Absent (or None) the interface says
  // no synchronization is needed, so the buffer names no stream and the call runs where any other
  // buffer's would: the caller's current stream as docs/gpu.md's rule for buffers that are not
  // torch's reads it (torch's current stream, else CuPy's, else the legacy default), the one the
  // rest of the caller's work is ordered on (issue #37). CUDA memory: 1 and 2, the legacy and
  // per-thread default streams, are cudaStream_t values CUDA takes as they are. Emulated memory: a
  // stream given names an emulated stream by its identity (commlib.emulated.Stream.handle; 0, 1 and
  // 2: the device's default stream, identity 0).
  if (v->kind == BufferKind::Emulated) {
    v->own_stream = stream != nullptr;
    v->stream = v->own_stream ? (named_stream <= 2 ? 0 : static_cast<uintptr_t>(named_stream))
                              : current_stream ? current_emulated_stream() : 0;
    if (v->own_stream && !emulated_device(v->device)->stream_named(v->stream)) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(named_stream));
      return problem(why, PyExc_ValueError, std::string("__cuda_array_interface__'s stream ") + hex +
                                                " is no live stream of emulated:" + std::to_string(v->device)),
             ForeignRead::Bad;
    }
  } else {
    v->own_stream = stream != nullptr;
    v->stream = v->own_stream ? static_cast<uintptr_t>(named_stream) : 0;
    if (!v->own_stream && current_stream && !current_cuda_stream(v->device, &v->stream))
      return problem(why, PyExc_RuntimeError, "the current CUDA stream could not be read"), ForeignRead::Bad;
  }
  return ForeignRead::Ok;
}

// __dlpack__ with the consumer's stream (`stream`: None, or the cudaStream_t as DLPack spells it)
// and max_version=(1, 0), or as much of it as this exporter's type takes.
PyObject* export_dlpack(PyObject* o, PyObject* stream) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  int known = -1;
  for (const auto& [t, k] : g_dlpack_kwargs)
    if (t == type) known = k;
  for (int k = known < 0 ? 2 : known; k >= 0; --k) {
    PyObject* args[] = {o, stream, g_max_version};
    PyObject* r = PyObject_VectorcallMethod(reader_name(kNameDlpack), args, 1,
                                            k == 2 ? g_kwnames_full : k == 1 ? g_kwnames_stream : nullptr);
    if (r != nullptr) {
      if (known < 0) g_dlpack_kwargs.emplace_back(Py_NewRef(type), k);
      return r;
    }
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) return nullptr;  // (an exporter of both kinds: try less)
    PyErr_Clear();
  }
  return nullptr;
}

ForeignRead read_dlpack(PyObject* o, PyObject* dl_device, BufferView* v, bool current_stream, BufferProblem* why) {
  long long type = 0, id = 0;
  if (!PyTuple_Check(dl_device) || PyTuple_GET_SIZE(dl_device) != 2 || !int_of(PyTuple_GET_ITEM(dl_device, 0), &type) ||
      !int_of(PyTuple_GET_ITEM(dl_device, 1), &id))
    return problem(why, PyExc_TypeError, "__dlpack_device__() did not return (device type, device id)"), ForeignRead::Bad;
  if (type == kDLCPU) return ForeignRead::NotForeign;  // host memory: the host path's to read
  if (type != kDLCUDA && type != kDLCUDAManaged)
    return problem(why, PyExc_ValueError,
                   "is on DLPack device type " + std::to_string(type) +
                       (type == kDLCUDAHost ? " (CUDA pinned host memory)" : "") +
                       "; device collectives take CUDA device memory (kDLCUDA, kDLCUDAManaged)"),
           ForeignRead::Bad;
  // The stream the call will run on, so the exporter orders its own work before it (DLPack: 1 is
  // the legacy default stream); None where the call names its stream.
  uintptr_t s = 0;
  PyObject* stream = Py_None;
  if (current_stream) {
    if (!current_cuda_stream(static_cast<int>(id), &s))
      return problem(why, PyExc_RuntimeError, "the current CUDA stream could not be read"), ForeignRead::Bad;
    stream = PyLong_FromUnsignedLongLong(s == 0 ? 1 : s);
  } else {
    Py_INCREF(stream);
  }
  PyObject* capsule = stream ? export_dlpack(o, stream) : nullptr;
  Py_XDECREF(stream);
  if (capsule == nullptr) return problem(why, PyExc_TypeError, "__dlpack__() failed: " + take_error_text()), ForeignRead::Bad;
  const DLTensor* t = nullptr;
  uint64_t flags = 0;
  if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"));
    if (m->version.major == 1) t = &m->dl_tensor, flags = m->flags;
  } else if (PyCapsule_IsValid(capsule, "dltensor")) {
    t = static_cast<const DLTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));  // DLManagedTensor starts with it
  }
  ForeignRead r = ForeignRead::Bad;
  const auto dt = t ? g_dlpack_dtypes.find({t->dtype.code, t->dtype.bits}) : g_dlpack_dtypes.end();
  if (t == nullptr) {
    problem(why, PyExc_TypeError, "__dlpack__() returned no DLPack capsule of a version commlib reads (0.x, 1.x)");
  } else if (dt == g_dlpack_dtypes.end() || t->dtype.lanes != 1) {
    problem(why, PyExc_TypeError, "unsupported DLPack dtype (code " + std::to_string(t->dtype.code) + ", " +
                                      std::to_string(t->dtype.bits) + " bits, " + std::to_string(t->dtype.lanes) +
                                      " lanes)");
  } else if (!row_major(t->ndim, t->shape, t->strides, 1)) {
    problem(why, PyExc_ValueError, "DLPack array must be C-contiguous");
  } else if (flags & kDLFlagReadOnly) {
    problem(why, PyExc_ValueError, "DLPack array is read-only (a collective writes its buffers)");
  } else if (flags & kDLFlagIsCopied) {
    problem(why, PyExc_ValueError, "DLPack export is a copy (results written there would not reach the array)");
  } else {
    int64_t count = 1;
    for (int i = 0; i < t->ndim; ++i) count *= t->shape[i];
    const uintptr_t ptr = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
    const int emulated = emulated_device_of(reinterpret_cast<const void*>(ptr), false);  // not a CUDA call
    if (emulated >= 0 && emulated != id) {
      problem(why, PyExc_ValueError, "DLPack names device " + std::to_string(id) + " but its memory is on emulated:" +
                                         std::to_string(emulated));
    } else {
      v->kind = emulated >= 0 ? BufferKind::Emulated : BufferKind::Cuda;
      v->address = ptr;
      v->count = count;
      v->dtype = dt->second;
      v->device = static_cast<int>(id);
      v->stream = emulated >= 0 ? (current_stream ? current_emulated_stream() : 0) : s;
      r = ForeignRead::Ok;
    }
  }
  Py_DECREF(capsule);  // not consumed: its destructor calls the exporter's deleter
  return r;
}

// o.name, or null without an error when `o` has no such attribute (bindings/optional_attr.h).
PyObject* lookup(PyObject* o, PyObject* name) { return optional_attr(o, name); }

}  // namespace

ForeignRead read_foreign_array(PyObject* o, BufferView* v, bool current_stream, BufferProblem* why) {
  if (!g_registered) return ForeignRead::NotForeign;  // dtypes.py registers the tables at import
  *v = BufferView{};
  if (PyObject* cai = lookup(o, reader_name(kNameCudaArrayInterface))) {
    const ForeignRead r = read_cai(cai, v, current_stream, why);
    Py_DECREF(cai);
    return r;
  }
  PyObject* device_of = lookup(o, reader_name(kNameDlpackDevice));
  if (device_of == nullptr) return ForeignRead::NotForeign;
  PyObject* dl_device = PyObject_CallNoArgs(device_of);
  Py_DECREF(device_of);
  if (dl_device == nullptr)
    return problem(why, PyExc_TypeError, "__dlpack_device__() failed: " + take_error_text()), ForeignRead::Bad;
  const ForeignRead r = read_dlpack(o, dl_device, v, current_stream, why);
  Py_DECREF(dl_device);
  return r;
}

void bind_foreign_arrays(py::module_& m) {
  m.def(
      "register_foreign_dtypes",
      [](py::dict typestrs, py::dict dlpack) {
        g_typestrs.clear();
        for (auto kv : typestrs) g_typestrs[py::cast<std::string>(kv.first)] = py::cast<DType>(kv.second);
        g_dlpack_dtypes.clear();
        for (auto kv : dlpack) g_dlpack_dtypes[py::cast<std::pair<int, int>>(kv.first)] = py::cast<DType>(kv.second);
        if (g_registered) return;
        g_kwnames_full = py::make_tuple("stream", "max_version").release().ptr();
        g_kwnames_stream = py::make_tuple("stream").release().ptr();
        g_max_version = py::make_tuple(1, 0).release().ptr();
        g_registered = true;
      },
      py::arg("typestrs"), py::arg("dlpack"),
      "The dtypes other libraries' device arrays may have: {__cuda_array_interface__ typestr: DType} and "
      "{(DLPack code, bits): DType} (commlib/device/dtypes.py registers them at import).");
  m.def(
      "read_device_array",
      [](py::handle o, const std::string& name) -> py::object {
        BufferView v;
        BufferProblem why;
        const ForeignRead r = read_foreign_array(o.ptr(), &v, false, &why);
        if (r == ForeignRead::NotForeign) return py::none();
        if (r == ForeignRead::Bad) {
          PyErr_SetString(why.type, (name + ": " + why.message).c_str());
          throw py::error_already_set();
        }
        // The interface's stream (on emulated memory the named emulated stream's identity); None
        // when it names none (DLPack's, and an interface without "stream"): the current one.
        return py::make_tuple(v.kind == BufferKind::Emulated ? "emulated" : "cuda", v.address, v.count, v.dtype, v.device,
                              v.own_stream ? py::object(py::int_(v.stream)) : py::object(py::none()));
      },
      py::arg("x"), py::arg("name"),
      "Another library's device array as the C++ entry reads it: (kind, address, count, dtype, device index, "
      "stream: the __cuda_array_interface__'s (emulated memory: the named emulated stream's identity, 0 for the "
      "default), None: the caller's current one), None when x is neither a "
      "__cuda_array_interface__ nor a DLPack device array; TypeError/ValueError naming `name` for what no "
      "collective takes (layout, dtype, read-only, device).");
}

}  // namespace commlib
