// Where rail_halving's paired pipeline applies (rail_halving.cc), for the schedules built from it.
#pragma once

#include "schedule/hierarchical_hosts.h"

namespace commlib {
namespace sched {

// Hosts of one size, a power of two, as are the hosts' count (two or more): rail_halving pairs its
// lanes by elements there; elsewhere it is hierarchical rabenseifner/ring.
bool halving_hosts(const HostMap& m);

// The deepest ramp rail_halving and rail_lanes take in CollArgs::share (Layout's ramp).
constexpr int kMaxRamp = 3;

}  // namespace sched
}  // namespace commlib
