// A device call's `stream=` argument read in C++ (bindings/buffer_view.h, read_named_stream): the
// C++ entry keys a call on the identity of the stream it runs on, whether the caller's current one
// or one it named, so that a call on a named stream hits however the stream is spelt (a new int
// object every call, another Python object of the same CUDA stream) and a named stream's new shape
// runs from C++ on the stream the engine wraps (bindings/device_p2p_streams.h) like a current
// stream's (issue #37, item 1). What it accepts, and the TypeError for anything else, are the device
// route's resolver's (commlib/core/device_route.py stream_resolver), which stays the Python path's.
#include <pybind11/pybind11.h>

#include <string>

#include "bindings/buffer_view.h"
#include "bindings/optional_attr.h"
#include "device/device.h"

namespace py = pybind11;

namespace commlib {

namespace {

PyObject* g_emulated_stream = nullptr;  // commlib.emulated.Stream (register_emulated_stream)
PyObject* g_stream_attr = nullptr;      // its "_stream" (the DeviceStream)
PyObject* g_cuda_stream_attr = nullptr;  // torch.cuda.Stream's "cuda_stream"
PyObject* g_ptr_attr = nullptr;          // CuPy's Stream.ptr

// o.name, or null without an error when `o` has no such attribute (bindings/optional_attr.h).
PyObject* stream_attr(PyObject* o, PyObject* name) { return optional_attr(o, name); }

// A non-negative int as a handle; false (no error set) for anything else.
bool handle_of(PyObject* o, uintptr_t* id) {
  if (o == nullptr || !PyLong_Check(o)) return false;
  const unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (PyErr_Occurred()) return PyErr_Clear(), false;
  *id = static_cast<uintptr_t>(v);
  return true;
}

}  // namespace

NamedStream read_named_stream(BufferKind kind, PyObject* stream, uintptr_t* id) {
  if (kind == BufferKind::Emulated) {
    if (g_emulated_stream == nullptr) return NamedStream::Unread;  // (emulated.py registers it at import)
    const int is = PyObject_IsInstance(stream, g_emulated_stream);
    if (is < 0) return PyErr_Clear(), NamedStream::Unread;
    if (!is) return NamedStream::WrongType;
    PyObject* s = PyObject_GetAttr(stream, g_stream_attr);
    if (s == nullptr) return PyErr_Clear(), NamedStream::Unread;
    NamedStream r = NamedStream::Unread;
    try {
      *id = reinterpret_cast<uintptr_t>(py::cast<DeviceStream*>(py::handle(s)));
      r = NamedStream::Ok;
    } catch (const py::cast_error&) {
    }
    Py_DECREF(s);
    return r;
  }
  if (kind != BufferKind::Cuda) return NamedStream::Unread;
  // The resolver's order: cuda_stream, then ptr, then an int itself.
  PyObject* value = stream_attr(stream, g_cuda_stream_attr);
  if (value == nullptr) value = stream_attr(stream, g_ptr_attr);
  if (value == nullptr) {
    if (!PyLong_Check(stream)) return NamedStream::WrongType;
    value = Py_NewRef(stream);
  }
  const bool ok = handle_of(value, id);
  Py_DECREF(value);
  return ok ? NamedStream::Ok : NamedStream::Unread;
}

PyObject* raise_stream_type_error(BufferKind kind, PyObject* stream) {
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(stream)), "__name__");
  const char* text = name != nullptr && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
  const std::string type = text != nullptr ? text : Py_TYPE(stream)->tp_name;
  Py_XDECREF(name);
  PyErr_Clear();
  const std::string expected = kind == BufferKind::Emulated ? "a commlib.emulated.Stream"
                                                            : "a torch.cuda.Stream, CuPy stream or cudaStream_t";
  PyErr_SetString(PyExc_TypeError, ("stream: expected " + expected + ", got " + type).c_str());
  return nullptr;
}

void bind_named_stream(py::module_& m) {
  g_stream_attr = PyUnicode_InternFromString("_stream");
  g_cuda_stream_attr = PyUnicode_InternFromString("cuda_stream");
  g_ptr_attr = PyUnicode_InternFromString("ptr");
  m.def(
      "register_emulated_stream",
      [](py::handle type) {
        if (!PyType_Check(type.ptr())) throw py::type_error("register_emulated_stream: expected a type");
        hold_ref(g_emulated_stream, type.ptr());
      },
      "Let the C++ entry read stream= on the emulated device: commlib.emulated.Stream (emulated.py, at import).");
  m.def(
      "stream_identity", [](DeviceStream& s) { return reinterpret_cast<uintptr_t>(&s); },
      "A DeviceStream's identity: what the C++ entry keys calls on it by and EmulatedDevice.stream_named finds "
      "(commlib.emulated.Stream.handle).");
  m.def(
      "read_named_stream",
      [](const std::string& kind, py::handle stream) -> py::object {
        const BufferKind k = kind == "emulated" ? BufferKind::Emulated : kind == "cuda" ? BufferKind::Cuda
                                                                                        : BufferKind::None;
        uintptr_t id = 0;
        switch (read_named_stream(k, stream.ptr(), &id)) {
          case NamedStream::Ok: return py::int_(id);
          case NamedStream::WrongType: raise_stream_type_error(k, stream.ptr()); throw py::error_already_set();
          default: return py::none();
        }
      },
      py::arg("kind"), py::arg("stream"),
      "For tests: a stream= argument of a call on device kind 'emulated' or 'cuda' as the C++ entry reads it: "
      "the stream's identity, None where it leaves the argument to the Python path, TypeError naming `stream` "
      "for a type the device route's resolver refuses.");
}

}  // namespace commlib
