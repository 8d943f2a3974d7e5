// The one buffer reader of the C++ entry from Python (bindings/fast_call.cc): a Python object seen
// as a tagged view (kind, address, count, dtype, device, stream), read through the C API without
// importing anything. Host kinds: an exact numpy.ndarray (its buffer protocol: writable,
// C-contiguous) and an exact torch.Tensor on the CPU; device kinds: commlib.emulated.Array and an
// exact torch.Tensor on a CUDA device. One registry of torch's types serves both (register_torch_types).
// Anything else (subclasses, other exporters, CuPy and __cuda_array_interface__/DLPack objects for
// now: docs/gpu.md) is "not readable" and the Python path takes it, which checks and explains.
#pragma once

#include <Python.h>

#include <cstdint>

#include "common/types.h"

namespace commlib {

enum class BufferKind : uint8_t { None, Host, Emulated, Cuda };

inline bool on_device(BufferKind k) { return k == BufferKind::Emulated || k == BufferKind::Cuda; }

struct BufferView {
  BufferKind kind = BufferKind::None;  // None: the argument was None
  uintptr_t address = 0;               // of the first element
  int64_t count = 0;                   // elements
  DType dtype = DType::UInt8;
  int device = -1;                     // device index (device kinds)
  // Device kinds, when asked for: the caller's current stream as an identity (torch's
  // cudaStream_t; the emulated stream of the innermost emulated.use_stream, 0 for the default).
  uintptr_t stream = 0;

  bool operator==(const BufferView& o) const {
    return kind == o.kind && address == o.address && count == o.count && dtype == o.dtype && device == o.device &&
           stream == o.stream;
  }
};

// Holds a NumPy array's Py_buffer while a call runs (released at scope exit).
class PyBufferHold {
 public:
  PyBufferHold() = default;
  PyBufferHold(const PyBufferHold&) = delete;
  PyBufferHold& operator=(const PyBufferHold&) = delete;
  ~PyBufferHold() {
    if (held_) PyBuffer_Release(&view_);
  }
  // The buffer of `o` (writable, C-contiguous, with its format); null (error cleared) when `o` has none.
  const Py_buffer* acquire(PyObject* o) {
    if (PyObject_GetBuffer(o, &view_, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return nullptr;
    }
    held_ = true;
    return &view_;
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// Reads `o` (None gives kind None). False, with no Python error set, when `o` is of no kind above
// or not usable as one (not contiguous, an unknown dtype, read-only, ...). `current_stream`: read
// the caller's current stream of a device buffer (not needed when the call names its stream).
bool read_buffer(PyObject* o, BufferView* v, PyBufferHold* hold, bool current_stream);

// Any exporter of the buffer protocol (not only numpy.ndarray) as a host view: false, no Python
// error set, unless writable, C-contiguous and of a dtype the core moves (_C.describe_buffer).
bool read_python_buffer(PyObject* o, BufferView* v, PyBufferHold* hold);

}  // namespace commlib
