// Topology checks (topology.h).
#include "sim/topology.h"

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
void check_nonneg(const char* name, double v) {
  if (!(v >= 0) || !std::isfinite(v))
    throw std::invalid_argument(std::string("topology.") + name + ": must be a finite number >= 0");
}
void check_pos(const char* name, double v) {
  if (!(v > 0) || !std::isfinite(v))
    throw std::invalid_argument(std::string("topology.") + name + ": must be a finite number > 0");
}
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
  check_nonneg("intra_latency_s", intra_latency_s);
  check_pos("intra_port_Bps", intra_port_Bps);
  check_nonneg("intra_bus_Bps", intra_bus_Bps);
  check_nonneg("inter_latency_s", inter_latency_s);
  if (hosts() > 1) check_pos("nic_Bps", nic_Bps);
  check_nonneg("reduce_s_per_byte", reduce_s_per_byte);
  check_nonneg("copy_s_per_byte", copy_s_per_byte);
  check_nonneg("op_overhead_s", op_overhead_s);
  check_nonneg("step_overhead_s", step_overhead_s);
  check_nonneg("send_overhead_s", send_overhead_s);
  check_nonneg("recv_overhead_s", recv_overhead_s);
  check_nonneg("nic_gap_s", nic_gap_s);
  check_nonneg("nic_burst_bytes", nic_burst_bytes);
  if (cores_per_host < 0) throw std::invalid_argument("topology.cores_per_host: must be >= 0 (0: a core per rank)");
  check_nonneg("sched_quantum_s", sched_quantum_s);
  check_nonneg("spin_s", spin_s);
  check_nonneg("wake_s", wake_s);
  if (chunk_bytes < 0) throw std::invalid_argument("topology.chunk_bytes: must be >= 0");
  for (size_t i = 0; i < memory_tiers.size(); ++i) {
    const MemoryTier& m = memory_tiers[i];
    const std::string at = "memory_tiers[" + std::to_string(i) + "].";
    if (m.above_bytes <= 0 || (i > 0 && m.above_bytes <= memory_tiers[i - 1].above_bytes))
      throw std::invalid_argument("topology." + at + "above_bytes: must be > 0 and above the previous tier's");
    check_pos((at + "port_Bps").c_str(), m.port_Bps);
    check_nonneg((at + "reduce_s_per_byte").c_str(), m.reduce_s_per_byte);
    check_nonneg((at + "copy_s_per_byte").c_str(), m.copy_s_per_byte);
  }
}

}  // namespace sim
}  // namespace commlib
