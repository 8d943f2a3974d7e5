// Topology checks (topology.h), and a call's checks on one (simulator.h, check_call).
#include "sim/topology.h"

#include <string>

#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace commlib {
namespace sim {

int Topology::hosts() const {
  int h = 0;
  for (int x : host_of) h = std::max(h, x + 1);
  return h;
}

namespace {

// validate()'s rules, by the check column of topology.h's field lists.
enum Check { Placement, AtLeast1, Natural, Flag, NonNeg, Pos, PosAcross, Free, Ascending };

void check_field(const std::string& name, double v, Check check, bool spans_hosts) {
  auto fail = [&](const char* rule) { throw std::invalid_argument("topology." + name + ": " + rule); };
  switch (check) {
    case AtLeast1:
      if (v < 1) fail("must be >= 1");
      break;
    case Natural:
      if (v < 0) fail("must be >= 0");
      break;
    case Flag:
      if (v != 0 && v != 1) fail("must be 0 or 1");
      break;
    case NonNeg:
      if (!(v >= 0) || !std::isfinite(v)) fail("must be a finite number >= 0");
      break;
    case PosAcross:
      if (!spans_hosts) break;
      [[fallthrough]];
    case Pos:
      if (!(v > 0) || !std::isfinite(v)) fail("must be a finite number > 0");
      break;
    case Placement:  // checked together in validate()
    case Ascending:  // a tier's above_bytes: against the tier before
    case Free:
      break;
  }
}

void check_field(const std::string&, const std::vector<int>&, Check, bool) {}

}  // namespace

void Topology::validate() const {
  if (host_of.empty()) throw std::invalid_argument("topology.host_of: no ranks");
  if (nic_of.size() != host_of.size())
    throw std::invalid_argument("topology.nic_of: one entry per rank expected");
  if (nics_per_host < 1) throw std::invalid_argument("topology.nics_per_host: must be >= 1");
  for (size_t r = 0; r < host_of.size(); ++r) {
    if (host_of[r] < 0) throw std::invalid_argument("topology.host_of: negative host for rank " + std::to_string(r));
    if (nic_of[r] < 0 || nic_of[r] >= nics_per_host)
      throw std::invalid_argument("topology.nic_of: rank " + std::to_string(r) + " uses NIC " +
                                  std::to_string(nic_of[r]) + " of " + std::to_string(nics_per_host));
  }
  const bool spans_hosts = hosts() > 1;
#define COMMLIB_SIM_CHECK_FIELD(type, name, init, dict, check) check_field(#name, name, check, spans_hosts);
  COMMLIB_SIM_TOPOLOGY_FIELDS(COMMLIB_SIM_CHECK_FIELD)
  for (size_t i = 0; i < memory_tiers.size(); ++i) {
    const MemoryTier& m = memory_tiers[i];
    const std::string at = "memory_tiers[" + std::to_string(i) + "].";
    if (m.above_bytes <= 0 || (i > 0 && m.above_bytes <= memory_tiers[i - 1].above_bytes))
      throw std::invalid_argument("topology." + at + "above_bytes: must be > 0 and above the previous tier's");
    const MemoryTier& tier = m;
#define COMMLIB_SIM_CHECK_TIER(type, name, init, dict, check) check_field(at + #name, tier.name, check, spans_hosts);
    COMMLIB_SIM_MEMORY_TIER_FIELDS(COMMLIB_SIM_CHECK_TIER)
#undef COMMLIB_SIM_CHECK_TIER
  }
#undef COMMLIB_SIM_CHECK_FIELD
}

void check_call(Collective c, int64_t count, int elem_bytes, int root, const Topology& topo) {
  topo.validate();
  const int P = topo.size();
  if (count < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(count));
  if (elem_bytes < 1) throw std::invalid_argument("elem_bytes: must be >= 1");
  if (c == Collective::Send || c == Collective::Recv || c == Collective::kCount)
    throw std::invalid_argument(std::string("collective: ") + collective_name(c) + " has no schedules");
  if (collective_has_root(c) && (root < 0 || root >= P))
    throw std::invalid_argument("root: " + std::to_string(root) + " out of range [0, " + std::to_string(P) + ")");
}

}  // namespace sim
}  // namespace commlib
