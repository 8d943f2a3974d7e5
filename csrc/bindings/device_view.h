// A device buffer as the cached device all_reduce (bindings/device_fast_call.cc) sees it, read
// from Python objects through the C API without importing anything: commlib's emulated arrays
// (commlib/device/emulated.py, read directly: they are commlib's own objects) and torch CUDA
// tensors (the attributes commlib/device/buffers.py reads, plus the device index and torch's
// current stream). Anything else is "not a view" and the Python path takes it.
#pragma once

#include <Python.h>

#include <cstdint>

#include "common/types.h"

namespace commlib {

struct DeviceView {
  bool cuda = false;      // a torch CUDA tensor; else an emulated array
  uintptr_t ptr = 0;      // device address of the first element
  int64_t count = 0;      // elements
  DType dtype = DType::UInt8;
  int device = 0;         // device index
  // The caller's current stream on that device, as an identity: torch's cudaStream_t, or the
  // emulated stream of the innermost emulated.use_stream (0: the device's default stream).
  uintptr_t stream = 0;
};

// False, with no Python error set, unless `o` is exactly an emulated.Array or (once registered) a
// contiguous strided torch.Tensor on a CUDA device, of a dtype the engine moves.
bool device_view(PyObject* o, DeviceView* v);

// The current emulated stream of this thread (emulated.use_stream mirrors its stack top here):
// its DeviceStream's address, 0 outside any use_stream.
uintptr_t emulated_current_stream();
void set_emulated_current_stream(uintptr_t stream);

}  // namespace commlib
