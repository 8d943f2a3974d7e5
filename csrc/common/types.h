// Enumerations shared by every layer: element types, reduction operators, collectives.
// Kept free of CUDA and Python so the schedule builders, kernels and executor all include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace commlib {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int8, UInt8, Int32, Int64, kCount };

enum class RedOp : uint8_t { Sum, Prod, Min, Max, Avg, PremulSum, BAnd, BOr, BXor, kCount };

enum class Collective : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Reduce,
  Gather,
  Scatter,
  Barrier,
  Send,
  Recv,
  kCount
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* op_name(RedOp op);
const char* collective_name(Collective c);
bool dtype_is_integer(DType t);
bool op_is_bitwise(RedOp op);
// True for collectives that combine values with a RedOp.
bool collective_reduces(Collective c);
// True for collectives whose semantics depend on a root rank.
bool collective_has_root(Collective c);

// Parse names used by the Python API; throw std::invalid_argument naming the argument.
DType parse_dtype(const std::string& name);
RedOp parse_op(const std::string& name);
Collective parse_collective(const std::string& name);

}  // namespace commlib
