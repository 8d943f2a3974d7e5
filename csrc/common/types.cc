#include "common/types.h"

namespace commlib {

namespace {
const char* const kDTypeNames[] = {"float32", "float64", "float16", "bfloat16",
                                   "int8",    "uint8",   "int32",   "int64"};
const size_t kDTypeSizes[] = {4, 8, 2, 2, 1, 1, 4, 8};
const char* const kOpNames[] = {"sum", "prod", "min", "max", "avg", "premul_sum", "band", "bor", "bxor"};
const char* const kCollectiveNames[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                        "broadcast",  "reduce",     "gather",         "scatter",
                                        "barrier",    "send",       "recv"};

template <typename E, size_t N>
E parse_enum(const std::string& name, const char* const (&names)[N], const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<E>(i);
  std::string msg = std::string(what) + ": unknown value '" + name + "' (expected one of:";
  for (size_t i = 0; i < N; ++i) msg += std::string(" ") + names[i];
  throw std::invalid_argument(msg + ")");
}
}  // namespace

size_t dtype_size(DType t) { return kDTypeSizes[static_cast<int>(t)]; }
const char* dtype_name(DType t) { return kDTypeNames[static_cast<int>(t)]; }
const char* op_name(RedOp op) { return kOpNames[static_cast<int>(op)]; }
const char* collective_name(Collective c) { return kCollectiveNames[static_cast<int>(c)]; }

bool dtype_is_integer(DType t) {
  return t == DType::Int8 || t == DType::UInt8 || t == DType::Int32 || t == DType::Int64;
}
bool op_is_bitwise(RedOp op) { return op == RedOp::BAnd || op == RedOp::BOr || op == RedOp::BXor; }
bool collective_reduces(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}
bool collective_has_root(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}

DType parse_dtype(const std::string& name) { return parse_enum<DType>(name, kDTypeNames, "dtype"); }
RedOp parse_op(const std::string& name) { return parse_enum<RedOp>(name, kOpNames, "op"); }
Collective parse_collective(const std::string& name) {
  return parse_enum<Collective>(name, kCollectiveNames, "collective");
}

}  // namespace commlib
