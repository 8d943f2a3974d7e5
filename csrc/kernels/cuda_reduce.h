// CUDA entry points of the reduction kernels: the same functors as the CPU loops (reduce_ops.h),
// so CPU and GPU results agree bit for bit. Asynchronous on `stream`; launch errors throw
// std::runtime_error, bad arguments std::invalid_argument (bitwise op on a floating dtype).
// Pointers are device (or managed) memory; any alignment works (16-byte aligned pointers take the
// vectorised path).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace commlib {

// `stop` (null: none): a word of mapped host memory; a launch that finds it nonzero when it starts
// writes nothing (the copy path's gated operations: device/device.h, copy_unless and the rest).

// dst[i] = dst[i] (op) src[i]; Avg and PremulSum reduce as Sum. dst may alias src exactly.
void cuda_reduce_inplace(void* dst, const void* src, size_t n, DType dtype, RedOp op, cudaStream_t stream,
                         const uint64_t* stop = nullptr);

// dst[i] = src[i] * scale (premul_sum), same numerics as scale_copy in cpu_reduce.h.
void cuda_scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale, cudaStream_t stream);

// dst[i] = dst[i] / divisor (avg), same numerics as divide_inplace in cpu_reduce.h; divisor > 0.
void cuda_divide_inplace(void* dst, size_t n, DType dtype, int64_t divisor, cudaStream_t stream,
                         const uint64_t* stop = nullptr);
// A byte copy as a kernel, skipped like the above when *stop is nonzero (memcpy cannot read a word).
void cuda_copy_unless(const uint64_t* stop, void* dst, const void* src, size_t bytes, cudaStream_t stream);
// Loads every kernel variant now (the current device's context), so no launch loads lazily.
void cuda_preload_kernels();

}  // namespace commlib
