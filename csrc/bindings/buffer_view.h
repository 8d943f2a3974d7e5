// A writable C-contiguous Python buffer (a NumPy array) seen as (address, elements, DType).
#pragma once

#include <Python.h>

#include <cstdint>

#include "common/types.h"

namespace commlib {

class BufferView {
 public:
  BufferView() = default;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }

  // False (with no Python error set) unless `obj` exports a writable C-contiguous buffer of a
  // supported element type.
  bool acquire(PyObject* obj) {
    if (PyObject_GetBuffer(obj, &view_, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    if (!format_dtype(view_.format, view_.itemsize, &dtype)) return false;
    count = view_.len / view_.itemsize;
    return true;
  }

  uintptr_t address() const { return reinterpret_cast<uintptr_t>(view_.buf); }

  DType dtype = DType::UInt8;
  int64_t count = 0;

 private:
  // struct-module format characters NumPy uses for the dtypes we move (native byte order only).
  static bool format_dtype(const char* f, Py_ssize_t itemsize, DType* out) {
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

  Py_buffer view_{};
  bool held_ = false;
};

}  // namespace commlib
