// The communicator's plan cache: the schedule of a call (and what auto chose for it), built on
// first use and kept per (collective, requested algorithm, root, count).
#include <cstdio>
#include <string>

#include "policy/auto_policy.h"
#include "host/communicator.h"
#include "schedule/registry.h"

namespace commlib {

std::string Communicator::auto_choice(Collective coll, int64_t bytes) const {
  return choose_auto_for_links(coll, env_algo_[static_cast<int>(coll)], bytes, size_, link_profile(topology_));
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

  const std::string algo = call.algo ? algorithm_name(call.coll, call.algo)
                                     : choose_auto_for_links(call.coll, env_algo_[static_cast<int>(call.coll)], bytes,
                                                             size_, link_profile(topology_));
  if (opts_.debug >= 1 && call.algo == 0) {
    std::string tag = std::string(collective_name(call.coll)) + ":" + algo;
    bool seen = false;
    for (const auto& s : logged_auto_) seen |= s == tag;
    if (!seen) {
      logged_auto_.push_back(tag);
      std::fprintf(stderr, "commlib INFO %s rank %d: auto picked %s for %s of %lld bytes on %d ranks\n",
                   opts_.label.c_str(), rank_, algo.c_str(), collective_name(call.coll),
                   static_cast<long long>(bytes), size_);
    }
  }
  Planned p;
  p.sched = build_schedule(CollArgs{call.coll, rank_, size_, call.count, call.root, topology_.host_of}, algo);
  p.algo = static_cast<uint8_t>(algorithm_index(call.coll, algo));
  p.name = algo;
  if (plans_.size() >= 512) plans_.clear();
  return plans_.emplace(key, std::move(p)).first->second;
}

}  // namespace commlib
