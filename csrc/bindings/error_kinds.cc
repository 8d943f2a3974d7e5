// The one mapping of C++ errors to Python exceptions (bindings/error_kinds.h).
#include "bindings/error_kinds.h"

#include <new>
#include <stdexcept>

#include "bindings/bindings.h"
#include "bootstrap/store_error.h"
#include "common/errors.h"

namespace py = pybind11;

namespace commlib {

namespace {

struct PythonClass {
  uint32_t kind;
  PyObject* cls;
};

// Filled by bind_error_classes (commlib's own) and at first use (Python's), read-only afterwards.
PythonClass g_classes[] = {
    {static_cast<uint32_t>(ErrorKind::Comm), nullptr},
    {static_cast<uint32_t>(ErrorKind::Mismatch), nullptr},
    {static_cast<uint32_t>(ErrorKind::Peer), nullptr},
};

}  // namespace

CoreError classify_error(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const CommError& e) {
    return {static_cast<uint32_t>(kind_of(e)), e.what()};
  } catch (const StoreError& e) {
    return {e.kind() == StoreError::Kind::Lost ? kCoreStoreLostError : kCoreRendezvousError, e.message()};
  } catch (const std::invalid_argument& e) {
    return {kCoreInvalidArgument, e.what()};
  } catch (const std::bad_alloc& e) {
    return {kCoreNoMemory, e.what()};
  } catch (const std::exception& e) {
    return {kCoreOtherError, e.what()};
  } catch (...) {
    return {kCoreOtherError, "commlib: unknown C++ exception"};
  }
}

// commlib.errors' class `name` (a new reference kept for the process), or null (the error cleared)
// where the module cannot be imported. Not at bind time: commlib.errors imports commlib._C.
static PyObject* store_error_class(const char* name) {
  PyObject* module = PyImport_ImportModule("commlib.errors");
  PyObject* cls = module ? PyObject_GetAttrString(module, name) : nullptr;
  Py_XDECREF(module);
  if (cls == nullptr) PyErr_Clear();
  return cls;
}

PyObject* python_error_class(uint32_t kind) {
  for (const PythonClass& c : g_classes)
    if (c.kind == kind && c.cls) return c.cls;
  if (kind == kCoreRendezvousError || kind == kCoreStoreLostError) {
    // (under the GIL, which serialises the first look-ups; a failed import is tried again next time)
    static PyObject* rendezvous = nullptr;
    static PyObject* lost = nullptr;
    PyObject*& cls = kind == kCoreStoreLostError ? lost : rendezvous;
    if (cls == nullptr) cls = store_error_class(kind == kCoreStoreLostError ? "StoreLostError" : "RendezvousError");
    if (cls != nullptr) return cls;
  }
  if (kind == kCoreInvalidArgument) return PyExc_ValueError;
  if (kind == kCoreNoMemory) return PyExc_MemoryError;
  return PyExc_RuntimeError;
}

void set_python_error(std::exception_ptr p) {
  const CoreError err = classify_error(p);
  if (err.kind == kCoreNoMemory)
    PyErr_NoMemory();
  else
    PyErr_SetString(python_error_class(err.kind), err.message.c_str());
}

void bind_error_classes(py::module_& m) {
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  static py::exception<MismatchError> mismatch_error(m, "MismatchError", comm_error.ptr());
  static py::exception<PeerError> peer_error(m, "PeerError", comm_error.ptr());
  comm_error.doc() = "Base of every commlib communication failure.";
  mismatch_error.doc() = "Ranks called different collectives, or one with different arguments.";
  peer_error.doc() = "A peer died, closed its communicator, aborted or did not answer within the timeout.";
  g_classes[0].cls = comm_error.ptr();
  g_classes[1].cls = mismatch_error.ptr();
  g_classes[2].cls = peer_error.ptr();
  // Every bound call's commlib errors go through set_python_error, the one mapping; anything else
  // is left to pybind's own translators (py::error_already_set, py::value_error, ...).
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const CommError&) {
      set_python_error(p);
    }
  });
}

}  // namespace commlib
