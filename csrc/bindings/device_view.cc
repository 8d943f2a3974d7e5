// Reading emulated arrays and torch CUDA tensors through the C API (device_view.h).
#include "bindings/device_view.h"

#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "device/device.h"

namespace py = pybind11;

namespace commlib {

namespace {

// emulated.Array and its slots (registered by commlib.device.emulated at import).
PyObject* g_emulated_array = nullptr;
PyObject* g_emulated_dtypes = nullptr;  // {dtype name: DType code}
PyObject *g_alloc = nullptr, *g_ptr = nullptr, *g_offset = nullptr, *g_count = nullptr, *g_dtype_name = nullptr,
         *g_device_index = nullptr;

// torch (registered by the device route on its first CUDA call; never run on a GPU here).
PyObject* g_torch_tensor = nullptr;
PyObject* g_torch_strided = nullptr;
PyObject* g_raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream(device) -> cudaStream_t
std::vector<std::pair<PyObject*, DType>> g_torch_dtypes;
PyObject *g_is_cuda = nullptr, *g_layout = nullptr, *g_dtype = nullptr, *g_is_contiguous = nullptr,
         *g_data_ptr = nullptr, *g_numel = nullptr, *g_get_device = nullptr;

thread_local uintptr_t t_emulated_stream = 0;

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

bool emulated_view(PyObject* o, DeviceView* v) {
  long long base = 0, offset = 0, count = 0, index = 0, code = 0;
  PyObject* alloc = PyObject_GetAttr(o, g_alloc);
  const bool ok_base = alloc != nullptr && long_of(alloc, g_ptr, false, &base);
  Py_XDECREF(alloc);
  if (!ok_base || !long_of(o, g_offset, false, &offset) || !long_of(o, g_count, false, &count) ||
      !long_of(o, g_device_index, false, &index))
    return PyErr_Clear(), false;
  PyObject* name = PyObject_GetAttr(o, g_dtype_name);
  PyObject* dt = name != nullptr && PyUnicode_CheckExact(name) ? PyDict_GetItemWithError(g_emulated_dtypes, name)
                                                               : nullptr;  // borrowed
  const bool known = dt != nullptr && PyLong_CheckExact(dt);
  if (known) code = PyLong_AsLongLong(dt);
  Py_XDECREF(name);
  if (!known || PyErr_Occurred()) return PyErr_Clear(), false;
  v->cuda = false;
  v->ptr = static_cast<uintptr_t>(base + offset);
  v->count = count;
  v->dtype = static_cast<DType>(code);
  v->device = static_cast<int>(index);
  v->stream = t_emulated_stream;
  return true;
}

// The torch CUDA reader: the checks of commlib/device/buffers.py's torch branch (a tensor failing
// them takes the Python path, which raises naming the argument), plus device and current stream.
bool torch_view(PyObject* o, DeviceView* v) {
  bool ok = false;
  PyObject *cuda = nullptr, *layout = nullptr, *dt = nullptr, *contig = nullptr, *stream = nullptr;
  long long ptr = 0, n = 0, index = 0;
  do {
    if (!(cuda = PyObject_GetAttr(o, g_is_cuda)) || cuda != Py_True) break;
    if (!(layout = PyObject_GetAttr(o, g_layout)) || layout != g_torch_strided) break;
    if (!(dt = PyObject_GetAttr(o, g_dtype))) break;
    bool known = false;
    for (const auto& [obj, code] : g_torch_dtypes)
      if (obj == dt) known = true, v->dtype = code;
    if (!known) break;
    if (!(contig = PyObject_CallMethodObjArgs(o, g_is_contiguous, nullptr)) || contig != Py_True) break;
    if (!long_of(o, g_data_ptr, true, &ptr) || !long_of(o, g_numel, true, &n) ||
        !long_of(o, g_get_device, true, &index))
      break;
    PyObject* idx = PyLong_FromLongLong(index);
    stream = idx ? PyObject_CallOneArg(g_raw_stream, idx) : nullptr;
    Py_XDECREF(idx);
    if (!stream || !PyLong_Check(stream)) break;
    v->stream = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(stream));
    v->cuda = true;
    v->ptr = static_cast<uintptr_t>(ptr);
    v->count = n;
    v->device = static_cast<int>(index);
    ok = !PyErr_Occurred();
  } while (false);
  PyErr_Clear();
  Py_XDECREF(cuda);
  Py_XDECREF(layout);
  Py_XDECREF(dt);
  Py_XDECREF(contig);
  Py_XDECREF(stream);
  return ok;
}

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

}  // namespace

bool device_view(PyObject* o, DeviceView* v) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  if (type == g_emulated_array) return emulated_view(o, v);
  if (type == g_torch_tensor && g_raw_stream != nullptr) return torch_view(o, v);
  return false;
}

uintptr_t emulated_current_stream() { return t_emulated_stream; }
void set_emulated_current_stream(uintptr_t stream) { t_emulated_stream = stream; }

void bind_device_view(py::module_& m) {
  m.def(
      "register_emulated_array",
      [](py::handle array_type, py::dict dtypes) {
        if (!PyType_Check(array_type.ptr())) throw py::type_error("register_emulated_array: expected a type");
        py::dict codes;
        for (auto item : dtypes) codes[item.first] = static_cast<int>(py::cast<DType>(item.second));
        g_alloc = intern("_alloc");
        g_ptr = intern("ptr");
        g_offset = intern("offset");
        g_count = intern("count");
        g_dtype_name = intern("dtype");
        g_device_index = intern("device_index");
        Py_XDECREF(g_emulated_dtypes);
        g_emulated_dtypes = codes.release().ptr();
        Py_XDECREF(g_emulated_array);
        g_emulated_array = array_type.inc_ref().ptr();
      },
      "Let the cached device all_reduce read commlib.emulated.Array (emulated.py does, at import): the type "
      "and {dtype name: _C.DType}.");
  m.def(
      "register_torch_device_tensors",
      [](py::handle tensor_type, py::handle strided, py::dict dtypes, py::handle raw_stream) {
        if (!PyType_Check(tensor_type.ptr())) throw py::type_error("register_torch_device_tensors: expected torch.Tensor");
        if (!PyCallable_Check(raw_stream.ptr())) throw py::type_error("register_torch_device_tensors: raw_stream");
        g_torch_dtypes.clear();
        for (auto item : dtypes) g_torch_dtypes.emplace_back(item.first.inc_ref().ptr(), py::cast<DType>(item.second));
        g_is_cuda = intern("is_cuda");
        g_layout = intern("layout");
        g_dtype = intern("dtype");
        g_is_contiguous = intern("is_contiguous");
        g_data_ptr = intern("data_ptr");
        g_numel = intern("numel");
        g_get_device = intern("get_device");
        g_torch_strided = strided.inc_ref().ptr();
        g_torch_tensor = tensor_type.inc_ref().ptr();
        Py_XDECREF(g_raw_stream);
        g_raw_stream = raw_stream.inc_ref().ptr();
      },
      "Let the cached device all_reduce read torch CUDA tensors: torch.Tensor, torch.strided, {torch dtype: "
      "_C.DType} and torch._C._cuda_getCurrentRawStream (the device route does, on its first CUDA call).");
  m.def(
      "set_emulated_current_stream",
      [](py::object stream) {
        t_emulated_stream = stream.is_none() ? 0 : reinterpret_cast<uintptr_t>(py::cast<DeviceStream*>(stream));
      },
      "This thread's current emulated stream (a DeviceStream, None: the default), as emulated.use_stream "
      "sets it: the cached device all_reduce keys on it.");
  m.def("emulated_current_stream", &emulated_current_stream,
        "This thread's current emulated stream as set_emulated_current_stream set it (an identity; 0: default).");
}

}  // namespace commlib
