// The one lowering's first half, shared by every engine (the host executor, the stream engine and
// what comes after them): a call resolves to a plan — the algorithm auto or the caller chose, its
// schedule for this rank and the peers it talks to — cached per (collective, requested algorithm,
// root, count) and dropped when the tuning table changes. Auto is resolved in one place
// (resolve_algorithm), from the communicator's host map, so an engine cannot pick differently
// from another on the same call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/topology.h"
#include "plan/call.h"
#include "policy/auto_policy.h"
#include "policy/flag_cutoff.h"
#include "policy/stream_stores.h"
#include "schedule/ir.h"

namespace commlib {

// What resolving a call needs of its communicator, fixed when the communicator is created.
struct PlanContext {
  int rank = 0, size = 1;
  Topology topology;                  // the host map: auto's link-kind rule reads it
  std::vector<std::string> env_algo;  // COMMLIB_ALGO_<COLLECTIVE> per collective ("" = unset)
  // COMMLIB_TOPOLOGY's cost model (null: auto uses the link-kind rule), policy/auto_policy.h.
  std::shared_ptr<const sim::Topology> cost_model;
};

// The context of a communicator of `topology` on `rank` of `size`, reading the overrides now.
PlanContext make_plan_context(int rank, int size, Topology topology);

// What a call of `requested` (0 = auto, else 1-based index) runs on the context's links: the
// policy's one resolution (policy/auto_policy.h: override, tuning table, cost model, link kind).
// Every engine resolves through this.
AlgorithmChoice resolve_call(const PlanContext& ctx, const CallShape& call, uint8_t requested);

struct ResolvedPlan {
  Schedule sched;          // empty for algorithm="nccl" (NCCL's own collective)
  uint8_t algo = 0;        // 1-based index of the algorithm chosen (or kNcclAlgorithmCode)
  std::string name;        // of the algorithm, for messages
  AlgorithmChoice choice;  // how it was chosen (hierarchical: the inter-host algorithm, the segment)
  std::vector<int> peers;  // the ranks this rank's schedule talks to, in first-use order
  bool one_sided = false;  // the schedule uses one-sided operations (ir.h): the kernel path only
  // The algorithm is registered one-sided (registry.h kOneSided), whatever this rank's schedule
  // holds (one rank's has no operation at all): read once here, not by name at every call.
  bool algorithm_one_sided = false;
  // Read once here rather than at every call (the host's call prologue, issue #44's per-call cost):
  // what COMMLIB_CMA=auto gives this call (policy/single_copy.h single_copy_auto_min: the tuning's
  // crossover, read under its lock; a new crossover table drops the plans, as a tuning table does),
  bool overridden = false;  // choice.source == "override" (COMMLIB_ALGO_<COLLECTIVE> named it)
  int64_t single_copy_auto = -1;
  // the largest call auto sends through the flags (policy/flag_cutoff.h; kFlagsAnySize: the slot
  // decides), read under its table's lock here, not at every call,
  int64_t flags_max = kFlagsAnySize;
  // from which call size its copies stream (policy/stream_stores.h; kStreamNoEntry: the footprint
  // rule decides), read the same way,
  int64_t streaming_start = kStreamNoEntry;
  // and the root's output in elements (what every rank's footprint of the call is reckoned from).
  int64_t root_output = 0;
  // The algorithm's lanes for this call (schedule/lanes.h; 1: list order): more than one, the host
  // executor runs them in flight (docs/DESIGN.md "Laned calls").
  int lanes = 1;
  // What the device paths run (kernels/device_list.h): a laned list in lock step with its lanes'
  // k-th steps merged into one step (`device_merged`, held in `merged`); else `sched` as it is.
  bool device_merged = false;
  Schedule merged;
  const Schedule& device_sched() const { return device_merged ? merged : sched; }
};

class PlanCache {
 public:
  explicit PlanCache(PlanContext ctx);
  const PlanContext& context() const { return ctx_; }
  // Rank auto's candidates with this cost model from now on (drops the cached plans).
  void set_cost_model(std::shared_ptr<const sim::Topology> model);
  // The plan of `call`, built on first use (std::invalid_argument for an unknown algorithm index).
  const ResolvedPlan& get(const CollectiveCall& call) { return *find(call); }
  // The same, held: valid after the cache drops it (a new tuning table, the cache's bound), for a
  // caller that keeps a resolved call (the stream engine's PreparedCall).
  std::shared_ptr<const ResolvedPlan> get_shared(const CollectiveCall& call) { return find(call); }
  // Calls of get/get_shared so far (tests pin that a prepared call makes none: issue #37).
  uint64_t lookups() const { return lookups_; }

 private:
  // The cached plan of `call` (built on first use), as held by the cache: no copy of the pointer.
  const std::shared_ptr<const ResolvedPlan>& find(const CollectiveCall& call);
  void drop_all();

  PlanContext ctx_;
  std::unordered_map<ScheduleKey, std::shared_ptr<const ResolvedPlan>, ScheduleKeyHash> plans_;
  // The last plan found and its key: a loop of the same call skips the hash lookup. Null whenever
  // plans_ is cleared.
  ScheduleKey last_key_;
  const std::shared_ptr<const ResolvedPlan>* last_ = nullptr;
  uint64_t tuning_generation_ = 0;  // of the tuning table the cached auto choices came from
  // Of the algorithm registry the cached plans were built from: a Python algorithm unregistered and
  // another registered in its place takes its index (registry.h), which the key holds.
  uint64_t registry_generation_ = 0;
  uint64_t lookups_ = 0;
};

}  // namespace commlib
