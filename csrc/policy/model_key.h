// An exact text key of a placed cost model and a call's shape, for the policy's memo caches (the
// candidate search's choices, the pipeline shapes): a prediction may depend on any field of the
// model, so every field of sim/topology.h's one list is written, floats exactly (hex).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/auto_policy.h"

namespace commlib {

namespace sim {
struct Topology;
}

struct KeyWriter {
  std::string k;
  void add(double v);
  void add(int64_t v) { k += std::to_string(v) + ","; }
  void add(int v) { add(static_cast<int64_t>(v)); }
  void add(const std::string& v) { k += std::to_string(v.size()) + ":" + v + ","; }
  void add(const std::vector<int>& v) {
    k += '|';
    for (int x : v) add(x);
    k += '|';
  }
  // The call's collective, count, element size and root.
  void add_call(const CallShape& call);
  // Every field of `t` and of its memory tiers.
  void add_model(const sim::Topology& t);
};

}  // namespace commlib
