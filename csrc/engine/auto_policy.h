// auto's policy in the engine, where the links are known: which algorithm a call gets when the
// user asked for "auto", keyed by the kinds of link the communicator's ranks are joined by.
//
// Within one host (every peer over shm) the registry's size/bytes policy applies (tuning table,
// then built-in heuristic, schedule/registry.h). When ranks span several hosts and some host holds
// several ranks, collectives with a hierarchical schedule use it: it moves every byte across the
// slow inter-host links as few times as possible (measured: bench/RESULTS_multihost.md). With one
// rank per host every link is TCP and the single-host policy's choice stands. COMMLIB_ALGO_<COLL>
// overrides all of this.
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"
#include "transport/fabric.h"

namespace commlib {

struct LinkProfile {
  bool crosses_hosts = false;  // some peer is reached over TCP
  bool shares_hosts = false;   // some host holds two or more ranks (shm links exist)
};

LinkProfile link_profile(const Topology& topo);

std::string choose_auto_for_links(Collective c, const std::string& env_value, int64_t bytes, int size,
                                  const LinkProfile& links);

}  // namespace commlib
