#include "plan/plan_cache.h"

#include <algorithm>

#include "kernels/device_list.h"
#include "plan/describe.h"
#include "common/shapes.h"
#include "policy/auto_policy.h"
#include "policy/flag_cutoff.h"
#include "policy/single_copy.h"
#include "policy/stream_stores.h"
#include "schedule/lanes.h"
#include "schedule/registry.h"

namespace commlib {

PlanContext make_plan_context(int rank, int size, Topology topology) {
  PlanContext ctx;
  ctx.rank = rank;
  ctx.size = size;
  ctx.topology = std::move(topology);
  for (int c = 0; c < static_cast<int>(Collective::kCount); ++c) {
    const Collective cc = static_cast<Collective>(c);
    const bool scheduled = cc != Collective::Send && cc != Collective::Recv;
    ctx.env_algo.push_back(scheduled ? algorithm_override(cc) : std::string());
  }
  return ctx;
}

AlgorithmChoice resolve_call(const PlanContext& ctx, const CallShape& call, uint8_t requested) {
  return resolve_algorithm(call, requested ? algorithm_name(call.coll, requested) : "auto",
                           ctx.env_algo[static_cast<int>(call.coll)], ctx.size, ctx.topology.host_of,
                           ctx.cost_model.get());
}

void PlanCache::set_cost_model(std::shared_ptr<const sim::Topology> model) {
  ctx_.cost_model = std::move(model);
  drop_all();
}

void PlanCache::drop_all() {
  plans_.clear();
  last_ = nullptr;
}

PlanCache::PlanCache(PlanContext ctx)
    : ctx_(std::move(ctx)), tuning_generation_(tuning_generation()), registry_generation_(registry_generation()) {}

const std::shared_ptr<const ResolvedPlan>& PlanCache::find(const CollectiveCall& call) {
  ++lookups_;
  const uint64_t gen = tuning_generation(), reg = registry_generation();
  // A new tuning table (auto may choose differently now), or algorithms added or removed (an index
  // of the key may name another algorithm now: a stale plan ran the old one's schedule).
  if (gen != tuning_generation_ || reg != registry_generation_) {
    drop_all();
    tuning_generation_ = gen;
    registry_generation_ = reg;
  }
  const int root = collective_has_root(call.coll) ? call.root : 0;
  const ScheduleKey key{static_cast<uint8_t>(call.coll), call.algo, root, call.count,
                        static_cast<uint8_t>(dtype_size(call.dtype))};
  if (last_ && key == last_key_) return *last_;
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    last_key_ = key;
    last_ = &it->second;
    return it->second;
  }

  ResolvedPlan p;
  if (call.algo == kNcclAlgorithmCode) {  // NCCL's own collective: every peer takes part
    p.algo = kNcclAlgorithmCode;
    p.name = "nccl";
    for (int q = 0; q < ctx_.size; ++q)
      if (q != ctx_.rank) p.peers.push_back(q);
  } else {
    p.choice = resolve_call(ctx_, CallShape{call.coll, call.count, static_cast<int>(dtype_size(call.dtype)), root},
                            call.algo);
    p.name = p.choice.algorithm;
    CollArgs args{call.coll, ctx_.rank, ctx_.size, call.count, call.root, ctx_.topology.host_of};
    p.sched = build_schedule(args, p.choice);
    args.compose(p.choice);
    p.lanes = schedule_lanes(args, p.name);
    p.device_merged = device_merges_rounds(p.sched, p.lanes);
    if (p.device_merged) p.merged = device_list(p.sched, p.lanes);
    p.algo = static_cast<uint8_t>(algorithm_index(call.coll, p.name));
    p.one_sided = uses_one_sided(p.sched);
    p.algorithm_one_sided = algorithm_is_one_sided(call.coll, p.name);
    p.overridden = p.choice.source == "override";
    const int64_t bytes = call.count * static_cast<int64_t>(dtype_size(call.dtype));
    p.single_copy_auto = single_copy_auto_min(call.coll, bytes, ctx_.size);
    p.flags_max = flag_cutoff(call.coll, ctx_.size);
    p.streaming_start = streaming_start(call.coll, ctx_.size);
    p.root_output = buffer_shapes(call.coll, call.count, ctx_.size, call.root, call.root).output;
    for (const Step& st : p.sched.steps)
      for (const Op& o : st.ops)
        if (o.peer >= 0 && std::find(p.peers.begin(), p.peers.end(), o.peer) == p.peers.end()) p.peers.push_back(o.peer);
  }
  if (plans_.size() >= 512) drop_all();
  auto& held = plans_.emplace(key, std::make_shared<const ResolvedPlan>(std::move(p))).first->second;
  last_key_ = key;
  last_ = &held;
  return held;
}

}  // namespace commlib
