// The communicator's side of the plan cache (plan/plan_cache.h): what auto picks on its links, the
// cost model it ranks candidates with, and the debug log of auto's choices.
#include <cstdio>
#include <stdexcept>
#include <string>

#include "host/communicator.h"
#include "policy/auto_policy.h"
#include "policy/flag_cutoff.h"
#include "schedule/registry.h"

namespace commlib {

std::string Communicator::auto_choice(Collective coll, int64_t bytes, int elem_bytes) const {
  // As a call of bytes / elem_bytes elements resolves (plan/plan_cache.cc): the model's sums, and so
  // a choice between candidates predicted alike, follow the element count, not only the bytes.
  if (elem_bytes < 1 || bytes % elem_bytes)
    throw std::invalid_argument("elem_bytes: " + std::to_string(elem_bytes) + " does not divide " + std::to_string(bytes) +
                                " bytes");
  return resolve_call(plans_.context(), CallShape{coll, bytes / elem_bytes, elem_bytes, 0}, 0).algorithm;
}

bool Communicator::auto_runs_flag_call(Collective coll, int64_t bytes) const {
  // As a call of `bytes` single-byte elements with no algorithm named routes (lowering.cc flag_route).
  // A "shared" broadcast that goes through the root's stream is no flag call.
  if (coll != Collective::Broadcast && coll != Collective::Barrier &&
      Executor::flag_exchange_input_bytes(coll, bytes, 1, size_) < 0)
    return false;  // (only the schedule: nothing to resolve)
  const AlgorithmChoice c = resolve_call(plans_.context(), CallShape{coll, bytes, 1, 0}, 0);
  const FlagRoute route =
      flag_route(coll, bytes, 1, c.source != "override", c.algorithm == "shared", flag_cutoff(coll, size_));
  return route != FlagRoute::None && route != FlagRoute::Stream;
}

void Communicator::set_cost_model(const sim::Topology& model) {
  plans_.set_cost_model(share_cost_model(model));
}

const ResolvedPlan& Communicator::plan(const CollectiveCall& call, int64_t bytes) {
  const ResolvedPlan& p = plans_.get(call);
  if (opts_.debug >= 1 && call.algo == 0) {
    const int root = collective_has_root(call.coll) ? call.root : 0;
    std::string tag = std::string(collective_name(call.coll)) + ":" + p.name + ":" + p.choice.inter + "/" + p.choice.intra + ":" +
                      (p.choice.source == "model" ? std::to_string(bytes) : "");
    bool seen = false;
    for (const auto& s : logged_auto_) seen |= s == tag;
    if (!seen) {
      logged_auto_.push_back(tag);
      std::fprintf(stderr, "commlib INFO %s rank %d: %s\n", opts_.label.c_str(), rank_,
                   describe_choice(CallShape{call.coll, bytes, 1, root}, size_, p.choice).c_str());
    }
  }
  return p;
}

}  // namespace commlib
