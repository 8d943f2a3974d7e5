// Per-rank rates of the simulator's run (simulator.h): ports, copies and reductions at the rate of
// the memory tier the rank's working set lands in, shared among the ranks of an oversubscribed core.
#pragma once

#include <cstdint>
#include <vector>

#include "common/types.h"
#include "sim/simulator.h"
#include "sim/topology.h"

namespace commlib {
namespace sim {

// One rank's memory-bound rates: the in-cache ones, or those of the last memory tier whose
// above_bytes the rank's working set (input + output + scratch buffer) exceeds (topology.h).
struct RankRates {
  double port_Bps = 0;
  double reduce_s_per_byte = 0;
  double copy_s_per_byte = 0;
};

// Per host: ranks per core where the ranks outnumber the cores (topology.h), else 1.
std::vector<double> oversubscription(const Topology& t);

// Every rank's rates for this call (res: the working-set statistics).
std::vector<RankRates> rank_rates(const Topology& t, Collective c, int64_t count, int elem_bytes, int root,
                                  const std::vector<int64_t>& scratch, Result& res);

}  // namespace sim
}  // namespace commlib
