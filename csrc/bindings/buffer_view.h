// The one buffer reader of the C++ entry from Python (bindings/fast_call.cc): a Python object seen
// as a tagged view (kind, address, count, dtype, device, stream), read through the C API without
// importing anything. Host kinds: an exact numpy.ndarray (its buffer protocol: writable,
// C-contiguous) and an exact torch.Tensor on the CPU; device kinds: commlib.emulated.Array and an
// exact torch.Tensor on a CUDA device. One registry of torch's types serves both (register_torch_types).
// Other libraries' device arrays (__cuda_array_interface__, DLPack) are read by
// read_foreign_array below. Anything else (subclasses, other exporters) is "not readable" and the
// Python path takes it, which checks and explains.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>

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
  // cudaStream_t; the emulated stream of the innermost emulated.use_stream, 0 for the default),
  // or the stream the buffer names itself (own_stream).
  uintptr_t stream = 0;
  // The buffer names the stream its data is valid on (a __cuda_array_interface__'s "stream", when
  // given: on emulated memory an emulated stream's identity): `stream` is that one whether asked
  // for or not, a call naming no stream runs there, and a call naming another one waits on it
  // first (bindings/foreign_arrays.cc, device_own_stream.cc). An interface without one reads as
  // any buffer: the current stream.
  bool own_stream = false;

  bool operator==(const BufferView& o) const {
    return kind == o.kind && address == o.address && count == o.count && dtype == o.dtype && device == o.device &&
           stream == o.stream && own_stream == o.own_stream;
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

// Why an array that is not commlib's own cannot be used (bindings/foreign_arrays.cc): the Python
// exception type and the message after "<argument name>: ".
struct BufferProblem {
  PyObject* type = nullptr;  // PyExc_TypeError, PyExc_ValueError or PyExc_RuntimeError
  std::string message;
};
enum class ForeignRead : uint8_t { NotForeign, Ok, Bad };
// Device memory of another library, read on every call (bindings/foreign_arrays.cc): an object
// with __cuda_array_interface__ (CuPy, Numba, ...), or a DLPack exporter (__dlpack__,
// __dlpack_device__) on a CUDA device; memory the emulated device holds is of kind Emulated.
// NotForeign: neither (or DLPack host memory: a host buffer); Bad: `why` says what is wrong
// (no Python error set either way). `current_stream`: as for read_buffer.
ForeignRead read_foreign_array(PyObject* o, BufferView* v, bool current_stream, BufferProblem* why);

// The caller's current stream on CUDA device `index` as the registered reader gives it (torch's
// current raw stream when torch's types are registered with it, else the one
// register_cuda_stream_reader named, e.g. CuPy's; 0, the legacy default stream, without either),
// or on the emulated device (the innermost emulated.use_stream's). False (no Python error set)
// when the reader raised.
bool current_cuda_stream(int index, uintptr_t* stream);
uintptr_t current_emulated_stream();

// A call's `stream=` argument (not None) on a device of `kind` as the identity the call cache keys
// streams by (bindings/named_stream.cc), read as the device route's resolver reads it
// (commlib/core/device_route.py stream_resolver): on the emulated device a commlib.emulated.Stream
// (its DeviceStream's address, what EmulatedDevice::stream_named finds); on CUDA a torch.cuda.Stream
// (`cuda_stream`), a CuPy stream (`ptr`) or an int (the cudaStream_t). WrongType: the resolver
// would raise TypeError (raise_stream_type_error says it); Unread: something the Python path must
// look at (an odd attribute value, a negative handle, an unknown kind). No Python error set.
enum class NamedStream : uint8_t { Ok, WrongType, Unread };
NamedStream read_named_stream(BufferKind kind, PyObject* stream, uintptr_t* id);
// Sets the resolver's TypeError for `stream` on `kind` ("stream: expected ..., got <type>"); returns null.
PyObject* raise_stream_type_error(BufferKind kind, PyObject* stream);

// The attribute and method names the reader asks of each kind, interned once (under the GIL) in
// one table, so that every reader of the one view uses the same objects.
enum ReaderName : unsigned {
  // commlib.emulated.Array (and its allocation's "ptr")
  kNameAlloc, kNamePtr, kNameOffset, kNameCount, kNameDtype, kNameDeviceIndex,
  // torch.Tensor
  kNameIsCpu, kNameIsCuda, kNameLayout, kNameIsContiguous, kNameDataPtr, kNameNumel, kNameGetDevice,
  // __cuda_array_interface__ (its dict's keys) and DLPack
  kNameCudaArrayInterface, kNameDlpack, kNameDlpackDevice, kNameData, kNameShape, kNameTypestr, kNameStrides,
  kNameStream, kNameMask,
  kReaderNames
};
PyObject* reader_name(ReaderName n);  // borrowed: interned for the process's life

// A registration's held reference: `slot` lets go of what it held and holds `o` (null: nothing).
inline void hold_ref(PyObject*& slot, PyObject* o) {
  Py_XINCREF(o);
  Py_XDECREF(slot);
  slot = o;
}

// Any exporter of the buffer protocol (not only numpy.ndarray) as a host view: false, no Python
// error set, unless writable, C-contiguous and of a dtype the core moves (_C.describe_buffer).
bool read_python_buffer(PyObject* o, BufferView* v, PyBufferHold* hold);

}  // namespace commlib
