// The simulator's trace (simulator.h, Trace): sized and its links named before a run fills it. The
// link ids are the run's (simulator.cc, Run::free_at_): rank r's port out r and in P + r, host h's
// bus 2P + h, then every host's NICs out, then in (host-major, NIC-minor).
#include <string>

#include "sim/simulator.h"

namespace commlib {
namespace sim {

void start_trace(Trace& trace, const Topology& t) {
  const int P = t.size(), H = t.hosts(), nics = t.nics_per_host;
  trace = Trace{};
  trace.steps.assign(P, {});
  auto& names = trace.link_names;
  for (const char* dir : {" out", " in"})
    for (int r = 0; r < P; ++r) names.push_back("rank " + std::to_string(r) + dir);
  for (int h = 0; h < H; ++h) names.push_back("host " + std::to_string(h) + " bus");
  for (const char* dir : {" out", " in"})
    for (int h = 0; h < H; ++h)
      for (int n = 0; n < nics; ++n) names.push_back("host " + std::to_string(h) + " NIC " + std::to_string(n) + dir);
}

}  // namespace sim
}  // namespace commlib
