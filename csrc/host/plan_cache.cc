// The communicator's side of the plan cache (plan/plan_cache.h): what auto picks on its links,
// and the debug log of auto's choices.
#include <cstdio>
#include <string>

#include "host/communicator.h"
#include "schedule/registry.h"

namespace commlib {

std::string Communicator::auto_choice(Collective coll, int64_t bytes) const {
  return resolve_algorithm(plans_.context(), coll, 0, bytes);
}

const ResolvedPlan& Communicator::plan(const CollectiveCall& call, int64_t bytes) {
  const ResolvedPlan& p = plans_.get(call);
  if (opts_.debug >= 1 && call.algo == 0) {
    std::string tag = std::string(collective_name(call.coll)) + ":" + p.name;
    bool seen = false;
    for (const auto& s : logged_auto_) seen |= s == tag;
    if (!seen) {
      logged_auto_.push_back(tag);
      std::fprintf(stderr, "commlib INFO %s rank %d: auto picked %s for %s of %lld bytes on %d ranks\n",
                   opts_.label.c_str(), rank_, p.name.c_str(), collective_name(call.coll),
                   static_cast<long long>(bytes), size_);
    }
  }
  return p;
}

}  // namespace commlib
