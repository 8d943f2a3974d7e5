// CPU entry points of the reduction kernels (the functors themselves live in reduce_ops.h and are
// shared with the CUDA launcher). All pointers may be unaligned; dst may alias src exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace commlib {

// dst[i] = dst[i] (op) src[i] for i < n. Avg reduces as Sum (the executor divides at the end);
// PremulSum reduces as Sum (the executor pre-scales the input). float16/bfloat16 compute in float32.
// Bitwise ops on floating dtypes throw std::invalid_argument.
void reduce_inplace(void* dst, const void* src, size_t n, DType dtype, RedOp op);

// dst[i] = src[i] * scale (premul_sum). Integers: rounded product as int (like torch's mul).
void scale_copy(void* dst, const void* src, size_t n, DType dtype, double scale);

// dst[i] = dst[i] / divisor (avg). Floats: true division in the accumulation type; integers:
// division truncating toward zero (as NCCL does for integer avg).
void divide_inplace(void* dst, size_t n, DType dtype, int64_t divisor);

}  // namespace commlib
