// The communicator's plan cache: the schedule of a call (and what auto chose for it), built on
// first use and kept per (collective, requested algorithm, root, count).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "policy/auto_policy.h"
#include "host/communicator.h"
#include "schedule/registry.h"

namespace commlib {

std::string Communicator::auto_choice(Collective coll, int64_t bytes) const {
  return resolve_algorithm(CallShape{coll, bytes, 1, 0}, "auto", env_algo_[static_cast<int>(coll)], size_,
                           topology_.host_of, cost_model_.get())
      .algorithm;
}

void Communicator::set_cost_model(const sim::Topology& model) {
  cost_model_ = share_cost_model(model);
  plans_.clear();
}

const Communicator::Planned& Communicator::plan(const CollectiveCall& call, int64_t bytes) {
  const uint64_t gen = tuning_generation();
  if (gen != tuning_generation_) {  // a new tuning table: auto may choose differently now
    plans_.clear();
    tuning_generation_ = gen;
  }
  const int root = collective_has_root(call.coll) ? call.root : 0;
  ScheduleKey key{static_cast<uint8_t>(call.coll), call.algo, root, call.count};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  // The one resolution (policy/auto_policy.h); cached per shape with the plan.
  const std::string requested = call.algo ? algorithm_name(call.coll, call.algo) : "auto";
  const AlgorithmChoice choice =
      resolve_algorithm(CallShape{call.coll, call.count, static_cast<int>(dtype_size(call.dtype)), root},
                        requested, env_algo_[static_cast<int>(call.coll)], size_, topology_.host_of, cost_model_.get());
  const std::string& algo = choice.algorithm;
  if (opts_.debug >= 1 && call.algo == 0) {
    std::string tag = std::string(collective_name(call.coll)) + ":" + algo + ":" + choice.inter_algorithm + ":" +
                      (choice.source == "model" ? std::to_string(bytes) : "");
    bool seen = false;
    for (const auto& s : logged_auto_) seen |= s == tag;
    if (!seen) {
      logged_auto_.push_back(tag);
      std::fprintf(stderr, "commlib INFO %s rank %d: %s\n", opts_.label.c_str(), rank_,
                   describe_choice(CallShape{call.coll, bytes, 1, root}, size_, choice).c_str());
    }
  }
  Planned p;
  CollArgs args{call.coll, rank_, size_, call.count, call.root, topology_.host_of};
  args.inter_algorithm = choice.inter_algorithm;
  args.segment = choice.segment;
  p.sched = build_schedule(args, algo);
  p.algo = static_cast<uint8_t>(algorithm_index(call.coll, algo));
  p.name = algo;
  p.inter = choice.inter_algorithm;
  if (plans_.size() >= 512) plans_.clear();
  return plans_.emplace(key, std::move(p)).first->second;
}

}  // namespace commlib
