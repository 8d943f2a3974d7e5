// DLPack's ABI (dlpack.h, 1.0): the structures commlib reads (bindings/foreign_arrays.cc: other
// libraries' device arrays) and writes (bindings/dlpack_export.cc: the symmetric pool's CUDA
// arrays as torch tensors and CuPy arrays), declared once.
#pragma once

#include <cstdint>

namespace commlib {
namespace dlpack {

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code, bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct DLPackVersion {
  uint32_t major, minor;
};
// The unversioned form (a "dltensor" capsule): what every consumer reads.
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
// The versioned form (a "dltensor_versioned" capsule, DLPack 1.0).
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1, kDLFlagIsCopied = 2;
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

}  // namespace dlpack
}  // namespace commlib
