// Per-rank rates (rates.h).
#include "sim/rates.h"

#include <algorithm>

#include "common/shapes.h"

namespace commlib {
namespace sim {

std::vector<double> oversubscription(const Topology& t) {
  std::vector<int> per_host(t.hosts(), 0);
  for (int h : t.host_of) ++per_host[h];
  std::vector<double> f(per_host.size(), 1.0);
  if (t.cores_per_host > 0)
    for (size_t h = 0; h < f.size(); ++h) f[h] = std::max(1.0, static_cast<double>(per_host[h]) / t.cores_per_host);
  return f;
}

std::vector<RankRates> rank_rates(const Topology& t, Collective c, int64_t count, int elem_bytes, int root,
                                  const std::vector<int64_t>& scratch, Result& res) {
  const std::vector<double> oversub = oversubscription(t);
  const int P = t.size();
  std::vector<RankRates> rates(P, RankRates{t.intra_port_Bps, t.reduce_s_per_byte, t.copy_s_per_byte});
  for (int r = 0; r < P; ++r) {
    const BufferShapes b = buffer_shapes(c, count, P, r, root);
    const int64_t working_set =
        (std::max<int64_t>(b.input, 0) + std::max<int64_t>(b.output, 0) + scratch[r]) * elem_bytes;
    res.max_working_set_bytes = std::max(res.max_working_set_bytes, working_set);
    const Topology::MemoryTier* tier = nullptr;
    for (const Topology::MemoryTier& m : t.memory_tiers)
      if (working_set > m.above_bytes) tier = &m;
    if (tier) {
      rates[r] = RankRates{tier->port_Bps, tier->reduce_s_per_byte, tier->copy_s_per_byte};
      ++res.ranks_beyond_cache;
    }
    // Ranks sharing a core move, copy and reduce their bytes with a share of its time.
    const double f = oversub[t.host_of[r]];
    rates[r] = RankRates{rates[r].port_Bps / f, rates[r].reduce_s_per_byte * f, rates[r].copy_s_per_byte * f};
  }
  return rates;
}

}  // namespace sim
}  // namespace commlib
