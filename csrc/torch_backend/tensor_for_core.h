// A tensor as the core's calls take it: its data's address, its bytes, and the dtype and count a
// data-movement call moves it as. One definition for every file of the torch backend (they were
// copies in each file's anonymous namespace, which clash where CI compiles the files as one:
// setup.py's COMMLIB_UNITY_BINDINGS).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "common/types.h"

namespace commlib {
namespace torch_backend {

// A CPU tensor the core can read once it is contiguous: dense, strided, neither conjugate nor
// negative view, and (an output) no element stored twice.
bool host_layout(const at::Tensor& t);
// The core's dtype for a reduction of `t` (false: one the core does not reduce).
bool reduction_dtype(const at::Tensor& t, DType* dt);

// Where `t`'s data starts, as the core's calls take a buffer.
inline uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

// A contiguous tensor's bytes as a flat uint8 tensor sharing its storage (which it keeps alive).
inline at::Tensor bytes_of(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())}, [t](void*) {},
                       at::TensorOptions().dtype(at::kByte));
}

// What a data-movement call moves of `t` (contiguous), as the Python path does (staging.py's
// as_bytes): the dtype the core knows as itself, any other as its bytes.
inline void moved_as(const at::Tensor& t, DType* dt, int64_t* count) {
  if (reduction_dtype(t, dt)) {
    *count = t.numel();
  } else {
    *dt = DType::UInt8;
    *count = static_cast<int64_t>(t.nbytes());
  }
}

}  // namespace torch_backend
}  // namespace commlib
