// The one buffer reader (buffer_view.h) and the registrations it reads by: numpy.ndarray
// (commlib/device/host_buffers.py), commlib.emulated.Array (emulated.py) and torch's types
// (commlib.torch at import, or the device route on its first CUDA call).
#include "bindings/buffer_view.h"

#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/numpy_view.h"
#include "device/device.h"

namespace py = pybind11;

namespace commlib {

namespace {

PyObject* g_array_type = nullptr;  // numpy.ndarray

// commlib.emulated.Array: the type and {dtype name: DType code}.
PyObject* g_emulated_array = nullptr;
PyObject* g_emulated_dtypes = nullptr;

// torch: one registry for host (CPU) and device (CUDA) tensors.
PyObject* g_torch_tensor = nullptr;
PyObject* g_torch_strided = nullptr;
PyObject* g_raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream(device) -> cudaStream_t; null: no CUDA
std::vector<std::pair<PyObject*, DType>> g_torch_dtypes;

thread_local uintptr_t t_emulated_stream = 0;

// Another library's current-stream reader (register_cuda_stream_reader: CuPy's
// cupy.cuda.get_current_stream and the attribute "ptr"), used where torch's is not registered.
PyObject* g_stream_reader = nullptr;
PyObject* g_stream_reader_attr = nullptr;  // null: the reader returns the cudaStream_t itself

// The integer value of o.name (attribute) or o.name() (method): false (error cleared) otherwise.
bool long_of(PyObject* o, PyObject* name, bool call, long long* out) {
  PyObject* r = call ? PyObject_CallMethodObjArgs(o, name, nullptr) : PyObject_GetAttr(o, name);
  bool ok = r != nullptr && PyLong_CheckExact(r);
  if (ok) *out = PyLong_AsLongLong(r);
  Py_XDECREF(r);
  ok = ok && !PyErr_Occurred();
  PyErr_Clear();
  return ok;
}

// struct-module format characters NumPy uses for the dtypes we move (native byte order only).
bool format_dtype(const char* f, Py_ssize_t itemsize, DType* out) {
  if (!f) f = "B";
  if (*f == '<' || *f == '=' || *f == '@') ++f;  // native byte order on x86-64 and aarch64
  if (!f[0] || f[1]) return false;
  switch (f[0]) {
    case 'f': *out = DType::Float32; return itemsize == 4;
    case 'd': *out = DType::Float64; return itemsize == 8;
    case 'e': *out = DType::Float16; return itemsize == 2;
    case 'b': *out = DType::Int8; return itemsize == 1;
    case 'B': *out = DType::UInt8; return itemsize == 1;
    case 'i': *out = DType::Int32; return itemsize == 4;
    case 'l': case 'q': *out = DType::Int64; return itemsize == 8;
    default: return false;
  }
}

}  // namespace

PyObject* reader_name(ReaderName n) {
  static PyObject* const* const names = [] {
    static const char* const text[kReaderNames] = {
        "_alloc", "ptr", "offset", "count", "dtype", "device_index",
        "is_cpu", "is_cuda", "layout", "is_contiguous", "data_ptr", "numel", "get_device",
        "__cuda_array_interface__", "__dlpack__", "__dlpack_device__", "data", "shape", "typestr", "strides",
        "stream", "mask"};
    static PyObject* interned[kReaderNames];
    for (unsigned i = 0; i < kReaderNames; ++i) interned[i] = PyUnicode_InternFromString(text[i]);
    return interned;
  }();
  return names[n];
}

bool read_python_buffer(PyObject* o, BufferView* v, PyBufferHold* hold) {
  const Py_buffer* b = hold->acquire(o);
  if (b == nullptr) return false;
  if (!format_dtype(b->format, b->itemsize, &v->dtype)) return false;
  v->kind = BufferKind::Host;
  v->address = reinterpret_cast<uintptr_t>(b->buf);
  v->count = b->len / b->itemsize;
  return true;
}

namespace {

bool emulated_view(PyObject* o, BufferView* v, bool current_stream) {
  long long base = 0, offset = 0, count = 0, index = 0, code = 0;
  PyObject* alloc = PyObject_GetAttr(o, reader_name(kNameAlloc));
  const bool ok_base = alloc != nullptr && long_of(alloc, reader_name(kNamePtr), false, &base);
  Py_XDECREF(alloc);
  if (!ok_base || !long_of(o, reader_name(kNameOffset), false, &offset) ||
      !long_of(o, reader_name(kNameCount), false, &count) || !long_of(o, reader_name(kNameDeviceIndex), false, &index))
    return PyErr_Clear(), false;
  PyObject* name = PyObject_GetAttr(o, reader_name(kNameDtype));
  PyObject* dt = name != nullptr && PyUnicode_CheckExact(name) ? PyDict_GetItemWithError(g_emulated_dtypes, name)
                                                               : nullptr;  // borrowed
  const bool known = dt != nullptr && PyLong_CheckExact(dt);
  if (known) code = PyLong_AsLongLong(dt);
  Py_XDECREF(name);
  if (!known || PyErr_Occurred()) return PyErr_Clear(), false;
  v->kind = BufferKind::Emulated;
  v->address = static_cast<uintptr_t>(base + offset);
  v->count = count;
  v->dtype = static_cast<DType>(code);
  v->device = static_cast<int>(index);
  v->stream = current_stream ? t_emulated_stream : 0;
  return true;
}

// torch CPU and CUDA tensors: the checks of commlib/device/buffers.py's torch branch and of
// host_buffers.py (a tensor failing them takes the Python path, which raises naming the argument).
bool torch_view(PyObject* o, BufferView* v, bool current_stream) {
  bool ok = false;
  PyObject *cpu = nullptr, *cuda = nullptr, *layout = nullptr, *dt = nullptr, *contig = nullptr, *stream = nullptr;
  do {
    if (!(cpu = PyObject_GetAttr(o, reader_name(kNameIsCpu)))) break;
    if (cpu != Py_True) {  // a CUDA tensor, once the device route registered torch's stream reader
      if (g_raw_stream == nullptr || !(cuda = PyObject_GetAttr(o, reader_name(kNameIsCuda))) || cuda != Py_True) break;
    }
    if (!(layout = PyObject_GetAttr(o, reader_name(kNameLayout))) || layout != g_torch_strided) break;
    if (!(dt = PyObject_GetAttr(o, reader_name(kNameDtype)))) break;
    bool known = false;
    for (const auto& [obj, code] : g_torch_dtypes)
      if (obj == dt) known = true, v->dtype = code;
    if (!known) break;
    if (!(contig = PyObject_CallMethodObjArgs(o, reader_name(kNameIsContiguous), nullptr)) || contig != Py_True) break;
    long long ptr = 0, n = 0, index = -1;
    if (!long_of(o, reader_name(kNameDataPtr), true, &ptr) || !long_of(o, reader_name(kNameNumel), true, &n)) break;
    if (cuda != nullptr) {
      if (!long_of(o, reader_name(kNameGetDevice), true, &index)) break;
      if (current_stream) {
        PyObject* idx = PyLong_FromLongLong(index);
        stream = idx ? PyObject_CallOneArg(g_raw_stream, idx) : nullptr;
        Py_XDECREF(idx);
        if (!stream || !PyLong_Check(stream)) break;
        v->stream = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(stream));
      }
    }
    v->kind = cuda != nullptr ? BufferKind::Cuda : BufferKind::Host;
    v->address = static_cast<uintptr_t>(ptr);
    v->count = n;
    v->device = static_cast<int>(index);
    ok = !PyErr_Occurred();
  } while (false);
  PyErr_Clear();
  Py_XDECREF(cpu);
  Py_XDECREF(cuda);
  Py_XDECREF(layout);
  Py_XDECREF(dt);
  Py_XDECREF(contig);
  Py_XDECREF(stream);
  return ok;
}

}  // namespace

bool current_cuda_stream(int index, uintptr_t* stream) {
  PyObject* reader = g_raw_stream != nullptr ? g_raw_stream : g_stream_reader;
  if (reader == nullptr) return *stream = 0, true;
  PyObject* idx = PyLong_FromLong(index);
  PyObject* s = idx ? PyObject_CallOneArg(reader, idx) : nullptr;
  Py_XDECREF(idx);
  if (s != nullptr && reader == g_stream_reader && g_stream_reader_attr != nullptr) {
    PyObject* ptr = PyObject_GetAttr(s, g_stream_reader_attr);
    Py_DECREF(s);
    s = ptr;
  }
  const bool ok = s != nullptr && PyLong_Check(s);
  if (ok) *stream = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(s));
  Py_XDECREF(s);
  if (PyErr_Occurred()) return PyErr_Clear(), false;
  return ok;
}

uintptr_t current_emulated_stream() { return t_emulated_stream; }

bool read_buffer(PyObject* o, BufferView* v, PyBufferHold* hold, bool current_stream) {
  *v = BufferView{};
  if (o == nullptr || o == Py_None) return true;
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  if (type == g_array_type) return read_numpy_array(o, v) == NumpyRead::Ok || read_python_buffer(o, v, hold);
  if (type == g_torch_tensor) return torch_view(o, v, current_stream);
  if (type == g_emulated_array) return emulated_view(o, v, current_stream);
  BufferProblem unused;  // the Python path reads it again and raises naming the argument
  return read_foreign_array(o, v, current_stream, &unused) == ForeignRead::Ok;
}

void bind_named_stream(py::module_& m);  // bindings/named_stream.cc: stream= as the entry reads it

void bind_buffer_view(py::module_& m) {
  bind_named_stream(m);
  m.def(
      "register_array_type",
      [](py::handle type) {
        if (!PyType_Check(type.ptr())) throw py::type_error("register_array_type: expected a type");
        hold_ref(g_array_type, type.ptr());
      },
      "Tell the C++ entry which type is numpy.ndarray (commlib/device/host_buffers.py does, at import).");
  m.def(
      "register_emulated_array",
      [](py::handle array_type, py::dict dtypes) {
        if (!PyType_Check(array_type.ptr())) throw py::type_error("register_emulated_array: expected a type");
        py::dict codes;
        for (auto item : dtypes) codes[item.first] = static_cast<int>(py::cast<DType>(item.second));
        hold_ref(g_emulated_dtypes, codes.ptr());
        hold_ref(g_emulated_array, array_type.ptr());
      },
      "Let the C++ entry read commlib.emulated.Array (emulated.py does, at import): the type and {dtype name: "
      "_C.DType}.");
  m.def(
      "register_torch_types",
      [](py::handle tensor_type, py::handle strided, py::dict dtypes, py::object raw_stream) {
        if (!PyType_Check(tensor_type.ptr())) throw py::type_error("register_torch_types: expected torch.Tensor");
        if (!raw_stream.is_none() && !PyCallable_Check(raw_stream.ptr()))
          throw py::type_error("register_torch_types: raw_stream must be callable or None");
        for (auto& [obj, code] : g_torch_dtypes) Py_DECREF(obj);
        g_torch_dtypes.clear();
        for (auto item : dtypes) g_torch_dtypes.emplace_back(item.first.inc_ref().ptr(), py::cast<DType>(item.second));
        hold_ref(g_torch_strided, strided.ptr());
        hold_ref(g_raw_stream, raw_stream.is_none() ? nullptr : raw_stream.ptr());
        hold_ref(g_torch_tensor, tensor_type.ptr());
      },
      py::arg("tensor_type"), py::arg("strided"), py::arg("dtypes"), py::arg("raw_stream") = py::none(),
      "Let the C++ entry read torch tensors: torch.Tensor, torch.strided, {torch dtype: _C.DType} and "
      "torch._C._cuda_getCurrentRawStream (None: CPU tensors only). One registry for host and device "
      "tensors (commlib.torch registers at import, the device route on its first CUDA call).");
  m.def(
      "register_cuda_stream_reader",
      [](py::object reader, py::object attr) {
        if (reader.is_none()) {  // (tests: back to no reader)
          hold_ref(g_stream_reader, nullptr);
          hold_ref(g_stream_reader_attr, nullptr);
          return;
        }
        if (!PyCallable_Check(reader.ptr())) throw py::type_error("register_cuda_stream_reader: reader must be callable");
        if (!attr.is_none() && !PyUnicode_Check(attr.ptr()))
          throw py::type_error("register_cuda_stream_reader: attr must be a str or None");
        hold_ref(g_stream_reader, reader.ptr());
        PyObject* name = attr.is_none() ? nullptr : PyUnicode_InternFromString(py::cast<std::string>(attr).c_str());
        hold_ref(g_stream_reader_attr, name);
        Py_XDECREF(name);
      },
      py::arg("reader"), py::arg("attr") = py::none(),
      "The current CUDA stream where torch's reader is not registered: reader(device index) (None: none), and the "
      "attribute of its result that is the cudaStream_t (CuPy: cupy.cuda.get_current_stream, 'ptr'). "
      "commlib/core/device_route.py registers it on the first CUDA call with CuPy imported.");
  m.def(
      "current_cuda_stream",
      [](int index) {
        uintptr_t s = 0;
        if (!current_cuda_stream(index, &s)) throw std::runtime_error("current_cuda_stream: the registered stream reader raised");
        return s;
      },
      py::arg("index"),
      "The current stream on CUDA device `index` as the C++ entry reads it (torch's reader, else the one "
      "register_cuda_stream_reader named, else 0: the legacy default stream). The Python path asks here, "
      "so both agree on the stream a call runs on.");
  m.def("cuda_stream_reader", [] { return g_raw_stream != nullptr ? "torch" : g_stream_reader != nullptr ? "other" : ""; },
        "Which current-stream reader is registered: 'torch', 'other' (register_cuda_stream_reader) or ''.");
  m.def("torch_cuda_readable", [] { return g_raw_stream != nullptr; },
        "Whether register_torch_types was given torch's stream reader (CUDA tensors are read in C++).");
  m.def(
      "read_buffer",
      [](py::handle o) -> py::object {
        BufferView v;
        PyBufferHold hold;
        if (!read_buffer(o.ptr(), &v, &hold, true)) return py::none();
        static const char* kinds[] = {"none", "host", "emulated", "cuda"};
        return py::make_tuple(kinds[static_cast<int>(v.kind)], v.address, v.count, v.dtype, v.device, v.stream);
      },
      "For tests: the C++ entry's view of o, (kind, address, count, dtype, device, stream: the current one's "
      "identity or the one o names itself), or None when it cannot read it (the Python path then takes the call).");
  m.def(
      "set_emulated_current_stream",
      [](py::object stream) {
        t_emulated_stream = stream.is_none() ? 0 : reinterpret_cast<uintptr_t>(py::cast<DeviceStream*>(stream));
      },
      "This thread's current emulated stream (a DeviceStream, None: the default), as emulated.use_stream "
      "sets it: the C++ entry keys device calls on it.");
  m.def("emulated_current_stream", [] { return t_emulated_stream; },
        "This thread's current emulated stream as set_emulated_current_stream set it (an identity; 0: default).");
}

}  // namespace commlib
