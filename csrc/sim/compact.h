// Schedules in the simulator's compact form. A 4096-rank ring all_reduce is 4096 x 8190 steps;
// kept as ir.h Schedules that is gigabytes, but the simulator needs only each op's kind, peer and
// size, and most steps of a rank repeat a handful of shapes. So each step is interned as a shape
// (its ops sorted by kind (receives, plain or reducing, as one), peer and, among a peer's messages
// in one direction, op order, each send
// keeping its place in the schedule's order) and each rank's program is a run-length list of shape ids.
#pragma once

#include <cstdint>
#include <memory>
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
  uint8_t nth = 0;    // a message's place among its step's messages with the same peer in its
                      // direction (receives: plain and reducing together), in op order: the order
                      // they match in (ir.h); 0 for other ops
  uint16_t post = 0;  // a send's place among its step's sends in the schedule (the order the
                      // rank posts them: the executor's), saturating; 0 for other ops
  int64_t count = 0;  // elements
};

// The order of a shape's ops: a receive, plain or reducing, sorts as one kind (its place among a
// peer's receives, SimOp::nth, is the order it matches in), every other op by its kind.
inline int sort_class(SimKind k) { return k == SimKind::RecvReduce ? static_cast<int>(SimKind::Recv) : static_cast<int>(k); }

class ShapeTable {
 public:
  uint32_t intern(std::vector<SimOp>& ops);  // sorts ops
  const SimOp* begin(uint32_t id) const { return ops_.data() + off_[id]; }
  const SimOp* end(uint32_t id) const { return ops_.data() + off_[id + 1]; }
  size_t size() const { return off_.size() - 1; }
  size_t bytes() const;  // memory held (the built-programs cache's accounting)

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
// A schedule of W lanes (schedule/lanes.h; `lanes`, if not null, receives W) gives W programs a
// rank, rank r's lane c at r * W + c: the steps of lane c (ir.h Step::lane), in order. `order` (if
// not null, and W > 1) receives each rank's list order as lanes (order[r][i]: the lane of rank r's
// step i), which the window (`window`, if not null: ir.h Schedule::window) and a list-order replay
// of the lanes need. `gates` (if not null, and W > 1) receives each rank's intra-window gates
// (ir.h Schedule::intra_window, schedule/lanes.h intra_window_gates: gates[r][i] the list step rank
// r's step i also waits for, -1 none), empty for every rank where the schedule has no intra window.
std::vector<Program> build_programs(Collective c, const Composition& how, int size, int64_t count, int root,
                                    const std::vector<int>& host_of, ShapeTable& shapes,
                                    std::vector<int64_t>* scratch = nullptr, int* lanes = nullptr,
                                    std::vector<std::vector<uint16_t>>* order = nullptr, int* window = nullptr,
                                    std::vector<std::vector<int>>* gates = nullptr);

// Every rank's compacted schedule of one call, as build_programs makes it, shared read-only.
struct BuiltPrograms {
  ShapeTable shapes;
  std::vector<Program> programs;  // per rank, or per rank and lane (build_programs)
  std::vector<int64_t> scratch;
  int lanes = 1;
  std::vector<std::vector<uint16_t>> order;  // lanes > 1: per rank, each step's lane in list order
  int window = 0;                            // ir.h Schedule::window (steps in flight; 0 none)
  std::vector<std::vector<int>> gates;       // lanes > 1: per rank, the intra window's (build_programs)
  size_t bytes = 0;  // memory held
};

// build_programs through a process-wide cache (built_cache.cc): auto's search, the ranking and the
// call that plays its choice simulate the same candidate again and again (the winner is built by
// the search, then by the call that plays it; at 8192 ranks building is most of a run). Keyed by
// everything a builder reads (ir.h CollArgs: the collective, size, count, root, host map and the
// composition) and the registry's generation (a name registered again builds anew), so a hit is
// exactly what a build would give. Least recently used entries go past kBuiltCacheBytes in all;
// a call whose programs alone exceed it is built and not kept. `hit` (if not null): whether it was.
constexpr size_t kBuiltCacheBytes = size_t{1} << 30;
std::shared_ptr<const BuiltPrograms> built_programs(Collective c, const Composition& how, int size, int64_t count,
                                                    int root, const std::vector<int>& host_of, bool* hit = nullptr);

// Empties the cache (tests, and a caller that wants its memory back).
void clear_built_programs();

}  // namespace sim
}  // namespace commlib
