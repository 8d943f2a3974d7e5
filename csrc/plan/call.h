// The call types every engine takes: a collective call on raw addresses, its plan-cache key and a
// point-to-point item. The host communicator (host/), the stream engine and the NCCL link
// (stream/) and the bindings share them; kept apart from the communicator so that none of them has
// to include another engine's header to name a call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/types.h"
#include "kernels/cpu_codecs.h"

namespace commlib {

struct CollectiveCall {
  Collective coll = Collective::AllReduce;
  uint8_t algo = 0;  // 0: auto; else 1 + position in algorithms(coll) (registry.h algorithm_index)
  uintptr_t input = 0, output = 0;
  int64_t count = 0;
  DType dtype = DType::Float32;
  RedOp op = RedOp::Sum;
  int root = 0;
  double scale = 1.0;  // premul_sum factor
  CodecSpec codec;     // compress=: every message encoded (host/compressed_lowering.cc); None: raw
};

// A collective call on raw addresses, with every field named once (the bindings and the torch
// backend both build theirs here).
inline CollectiveCall collective_call_on(Collective coll, uint8_t algo, uintptr_t input, uintptr_t output,
                                         int64_t count, DType dtype, RedOp op = RedOp::Sum, int root = 0,
                                         double scale = 1.0) {
  CollectiveCall call;
  call.coll = coll;
  call.algo = algo;
  call.input = input;
  call.output = output;
  call.count = count;
  call.dtype = dtype;
  call.op = op;
  call.root = root;
  call.scale = scale;
  return call;
}

// Keyed by the *requested* algorithm (0 = auto), so a cached entry also remembers what auto chose.
// auto chooses by bytes (count x element size: tuning table, heuristic, cost model), so the element
// size is part of the key: two calls of the same count in int8 and float64 are 8x apart in bytes
// and may get different algorithms. (A schedule itself counts elements; dtypes of one size share.)
struct ScheduleKey {
  uint8_t coll = 0, algo = 0;
  int32_t root = 0;
  int64_t count = 0;
  uint8_t elem_bytes = 0;
  bool operator==(const ScheduleKey& o) const {
    return coll == o.coll && algo == o.algo && root == o.root && count == o.count && elem_bytes == o.elem_bytes;
  }
};

struct ScheduleKeyHash {
  size_t operator()(const ScheduleKey& k) const {
    return std::hash<int64_t>()(k.count) ^ (static_cast<size_t>(k.coll) << 48) ^
           (static_cast<size_t>(k.algo) << 56) ^ (static_cast<size_t>(static_cast<uint32_t>(k.root)) << 20) ^
           (static_cast<size_t>(k.elem_bytes) << 40);
  }
};

struct P2PItem {
  bool send = true;
  uintptr_t ptr = 0;
  int64_t count = 0;
  int peer = 0;
};

}  // namespace commlib
