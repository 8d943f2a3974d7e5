// NumPy arrays read from the array object itself rather than through the buffer protocol: the
// fast entry's host buffers (bindings/fast_call.cc) are NumPy arrays on every call of the main
// job, and PyObject_GetBuffer on an ndarray builds its format string and shape info each time
// (numpy's _buffer_get_info: ~620 instructions a buffer, callgrind, numpy 2.4; a 4-rank
// reduce_scatter of 512 B passes two buffers and costs ~9,200 instructions a call in all, and on
// 4 ranks over 2 cores every instruction of every rank is paid in the call's time).
//
// The fields read are the ones NumPy's own C-API macros (PyArray_DATA, PyArray_NDIM, PyArray_DIMS,
// PyArray_DESCR, PyArray_FLAGS) read inline in every compiled extension, so NumPy keeps them where
// they are in 1.x and 2.x alike; of the dtype only `byteorder` and `type_num`, which sit at the same
// offsets in both (2.x moved `elsize`, after them). Still, the first array read this way is read
// through the buffer protocol too, and a disagreement turns this reader off for the process.
#include "bindings/numpy_view.h"

#include <cstdint>

namespace commlib {

namespace {

// numpy/ndarraytypes.h: PyArrayObject_fields' first fields, PyArray_Descr's first fields.
struct NpyDescrHead {
  PyObject_HEAD
  PyTypeObject* typeobj;
  char kind, type, byteorder, former_flags;
  int type_num;
};
struct NpyArrayHead {
  PyObject_HEAD
  char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  NpyDescrHead* descr;
  int flags;
};
constexpr int kCContiguous = 0x0001, kWriteable = 0x0400;  // NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE
constexpr unsigned kWarnOnWrite = 1u << 31;                // NPY_ARRAY_WARN_ON_WRITE (the buffer path warns)

// NumPy's built-in type numbers (NPY_TYPES) of the dtypes the core moves; LP64: long is 8 bytes.
bool dtype_of(int type_num, DType* out) {
  switch (type_num) {
    case 1: *out = DType::Int8; return true;      // NPY_BYTE
    case 2: *out = DType::UInt8; return true;     // NPY_UBYTE
    case 5: *out = DType::Int32; return sizeof(int) == 4;     // NPY_INT
    case 7: *out = DType::Int64; return sizeof(long) == 8;    // NPY_LONG
    case 9: *out = DType::Int64; return sizeof(long long) == 8;  // NPY_LONGLONG
    case 11: *out = DType::Float32; return true;  // NPY_FLOAT
    case 12: *out = DType::Float64; return true;  // NPY_DOUBLE
    case 23: *out = DType::Float16; return true;  // NPY_HALF
    default: return false;
  }
}

enum class Checked : uint8_t { Unchecked, Agrees, Off };
Checked g_checked = Checked::Unchecked;  // (read under the GIL)

}  // namespace

NumpyRead read_numpy_array(PyObject* o, BufferView* v) {
  if (g_checked == Checked::Off) return NumpyRead::UseBuffer;
  const auto* a = reinterpret_cast<const NpyArrayHead*>(o);
  const unsigned flags = static_cast<unsigned>(a->flags);
  // Not C-contiguous, read-only or warning on write: the buffer protocol decides (and refuses).
  if ((flags & (kCContiguous | kWriteable)) != (kCContiguous | kWriteable) || (flags & kWarnOnWrite))
    return NumpyRead::UseBuffer;
  const NpyDescrHead* d = a->descr;
  DType dt;
  const bool native = d->byteorder != (PY_BIG_ENDIAN ? '<' : '>');
  if (!native || !dtype_of(d->type_num, &dt)) return NumpyRead::UseBuffer;
  int64_t n = 1;
  for (int i = 0; i < a->nd; ++i) n *= a->dimensions[i];
  BufferView mine;
  mine.kind = BufferKind::Host;
  mine.address = reinterpret_cast<uintptr_t>(a->data);
  mine.count = n;
  mine.dtype = dt;
  if (g_checked == Checked::Unchecked) {
    BufferView theirs;
    PyBufferHold hold;
    const bool ok = read_python_buffer(o, &theirs, &hold);
    const bool same = ok && theirs.address == mine.address && theirs.count == mine.count && theirs.dtype == mine.dtype;
    g_checked = same ? Checked::Agrees : Checked::Off;
    if (!same) return NumpyRead::UseBuffer;
  }
  *v = mine;
  return NumpyRead::Ok;
}

bool numpy_reader_agrees() { return g_checked == Checked::Agrees; }

}  // namespace commlib
