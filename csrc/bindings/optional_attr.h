// `o.name` when `o` has that attribute, else null, with no Python error left set either way: the
// C++ entry's readers (named_stream.cc, foreign_arrays.cc) ask objects for attributes they may not
// have on every call, and a missed attribute must not cost an AttributeError made and cleared.
// CPython 3.13 made the private `_PyObject_LookupAttr` public as `PyObject_GetOptionalAttr` (and
// keeps the old name only as a deprecated alias); one shim compiles on both (issue #37).
#pragma once

#include <Python.h>

namespace commlib {

inline PyObject* optional_attr(PyObject* o, PyObject* name) {
  PyObject* r = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  if (PyObject_GetOptionalAttr(o, name, &r) < 0) PyErr_Clear();
#else
  if (_PyObject_LookupAttr(o, name, &r) < 0) PyErr_Clear();
#endif
  return r;
}

}  // namespace commlib
