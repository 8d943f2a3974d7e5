// Schedules in the simulator's compact form. A 4096-rank ring all_reduce is 4096 x 8190 steps;
// kept as ir.h Schedules that is gigabytes, but the simulator needs only each op's kind, peer and
// size, and most steps of a rank repeat a handful of shapes. So each step is interned as a shape
// (its ops sorted by kind and peer, each send keeping its place in the schedule's order) and each rank's program is a run-length list of shape ids.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/flat_map.h"
#include "schedule/ir.h"

namespace commlib {
namespace sim {

// One-sided ops (ir.h) too: Get/GetReduce/Put carry the peer and count; Signal/Wait carry the
// peer and, in `count`, the tag; a reduce_to_all is what it moves: a GetReduce (the reduction
// as the bytes come) and a Put with every peer, all from the step's entry; a reduce_from_all the
// GetReduces alone.
enum class SimKind : uint8_t { Send, Recv, RecvReduce, Copy, Reduce, Get, GetReduce, Put, Signal, Wait };

struct SimOp {
  int32_t peer;   // -1 for local ops
  SimKind kind;
  uint16_t post = 0;  // a send's place among its step's sends in the schedule (the order the
                      // rank posts them: the executor's), saturating; 0 for other ops
  int64_t count = 0;  // elements
};

class ShapeTable {
 public:
  uint32_t intern(std::vector<SimOp>& ops);  // sorts ops
  const SimOp* begin(uint32_t id) const { return ops_.data() + off_[id]; }
  const SimOp* end(uint32_t id) const { return ops_.data() + off_[id + 1]; }
  size_t size() const { return off_.size() - 1; }

 private:
  std::vector<SimOp> ops_;
  std::vector<uint32_t> off_{0};
  std::vector<uint32_t> same_hash_;
  FlatMap by_hash_;
};

// (shape id, number of consecutive steps with that shape)
using Program = std::vector<std::pair<uint32_t, uint32_t>>;

// Builds every rank's schedule of `how` (ir.h: the algorithm, hierarchical's phases and segment)
// with the registry's builder and compacts it. `host_of` is the topology's placement, handed to
// topology-aware (hierarchical) builders through CollArgs.
// `scratch` (if not null) receives each rank's scratch elements (Schedule::scratch_count).
std::vector<Program> build_programs(Collective c, const Composition& how, int size, int64_t count, int root,
                                    const std::vector<int>& host_of, ShapeTable& shapes,
                                    std::vector<int64_t>* scratch = nullptr);

}  // namespace sim
}  // namespace commlib
