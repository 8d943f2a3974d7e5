// NumPy arrays read from the ndarray's own fields (bindings/numpy_view.cc says why and which).
#pragma once

#include "bindings/buffer_view.h"

namespace commlib {

enum class NumpyRead : uint8_t { Ok, UseBuffer };
// `o` must be exactly numpy.ndarray (the type read_buffer registered). Ok: *v holds a host buffer
// (C-contiguous, writable, a dtype the core moves in native byte order); UseBuffer: read it through
// the buffer protocol instead (anything else, or this reader turned off). Needs the GIL.
NumpyRead read_numpy_array(PyObject* o, BufferView* v);
// Whether the reader was checked against the buffer protocol and agreed (tests).
bool numpy_reader_agrees();

}  // namespace commlib
