// The policy caches' key writer (model_key.h).
#include "policy/model_key.h"

#include <cstdio>

#include "sim/topology.h"

namespace commlib {

void KeyWriter::add(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%a,", v);
  k += buf;
}

void KeyWriter::add_call(const CallShape& call) {
  for (int64_t v : {static_cast<int64_t>(call.coll), call.count, static_cast<int64_t>(call.elem_bytes),
                    static_cast<int64_t>(call.root)})
    add(v);
}

void KeyWriter::add_model(const sim::Topology& t) {
#define COMMLIB_KEY_FIELD(type, name, init, dict, check) add(t.name);
  COMMLIB_SIM_TOPOLOGY_FIELDS(COMMLIB_KEY_FIELD)
  for (const auto& m : t.memory_tiers) {
#define COMMLIB_KEY_TIER(type, name, init, dict, check) add(m.name);
    COMMLIB_SIM_MEMORY_TIER_FIELDS(COMMLIB_KEY_TIER)
#undef COMMLIB_KEY_TIER
  }
#undef COMMLIB_KEY_FIELD
}

}  // namespace commlib
