// The machine the simulator plays schedules on (docs/simulator.md). Every field is a physical or
// software parameter with a name, listed once below; presets and their sources live in commlib/sim/topologies.py,
// which applies protocol efficiencies before handing bandwidths here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace commlib {
namespace sim {

// Topology's fields, written once (an X-macro): the struct below declares them, validate() checks
// them, the binding reads them from a dict (bindings/sim_bindings.cc, _C.sim_topology_fields) and
// the policy's caches key on them (policy/model_key.cc); tests/sim/test_topology_fields.py checks
// that commlib/sim's and commlib/perf's makers write these names. Adding a field is one row here
// (and one in each Python maker). X(type, name, default, dict, check):
//   dict: Need (the binding's dict must have it) or Opt (absent: the default);
//   check: Placement (host_of, nic_of, checked together), AtLeast1, Natural (an integer >= 0),
//     Flag (0 or 1), NonNeg (a finite number >= 0), Pos (> 0), PosAcross (> 0 once ranks span hosts), Free.
// What they mean:
// Placement: rank -> host, rank -> NIC index on its host (rails: local GPU i uses NIC i).
// Inside a host: each rank has a port with intra_port_Bps per direction (NVLink to NVSwitch, or a
// core's copy bandwidth on shared memory), and optionally one bus all intra-host traffic of a host
// shares (intra_bus_Bps: memory bandwidth for shared memory; 0 = no such bus).
// Between hosts: every NIC has nic_Bps per direction; the switch fabric is non-blocking.
// Computation: seconds per byte reduced (recv_reduce, reduce) and copied locally (copy).
// Software: fixed cost per communication op posted, and per step entered.
// Per-message costs (LogGP's o and g): a rank's CPU spends send_overhead_s posting each send and
// recv_overhead_s taking each message in, one message after another (a rank talking to 1000
// peers pays 1000 of them), and a NIC starts at most one message every nic_gap_s in each
// direction (its message rate). All 0: messages cost only latency and bandwidth. A rank's sends
// are posted at its entry into their step, in the order the schedule lists them (the executor's).
// intra_by_device: messages inside a host are moved by the devices (GPU kernels: NVLink copies
// by the SMs, a thread block per channel), not by the rank's CPU: their send and receive
// overheads are each message's own (added to its latency, messages in parallel), off the CPU
// that posts network messages one after another (NCCL's proxy thread). 0: the CPU moves them too
// (shared memory between processes), one after another with its network messages.
// nic_burst_bytes: a token-bucket rate limit on each NIC direction (tc tbf, what scripts/netns.sh
// puts on every veth): nic_Bps is the bucket's rate, nic_burst_bytes its size; bytes with tokens
// leave at once (the veth itself has no rate modelled), the rest at nic_Bps. The bucket starts
// empty: the steady state of back-to-back calls, whose bytes drain it, so a call pays its bytes at
// nic_Bps overall, but its steps' latencies and the refill overlap. 0: no bucket, every message's
// bytes at nic_Bps (a real NIC).
// CPU scheduling (docs/simulator.md, "Waiting"): all zero (the presets) = every rank has a core
// of its own and finds a message as soon as it arrives.
//   cores_per_host: cores a host's ranks share (0: one per rank). A host with R ranks on C < R
//   cores is oversubscribed by f = R / C: its ranks' op and step overheads take f times as long
//   and their port, copy and reduction rates are divided by f (CPU ranks move their bytes with
//   the cores they share), and every receive there pays the wake-up plus
//   (f - 1) * sched_quantum_s waiting for a core, the receiver's peer not being scheduled.
//   Spin then sleep: a receiver spins spin_s for its message; one whose message's first bytes
//   arrive later than that after it entered the step sleeps, and is running again wake_s after
//   they arrive (futex wake-up, scheduling); the rest of the message streams in meanwhile.
//   inter_spin_s: a wait for a message from another host spins this instead (< 0: spin_s),
//   offering the core between polls (commlib's TCP wait: COMMLIB_TCP_SPIN_US, sched_yield between
//   polls, while shared-memory waits spin COMMLIB_SPIN_US without yielding). A yielding spinner is
//   never asleep: within its spin it pays no wake-up, even on an oversubscribed host (it still
//   waits its turn for a core there).
// chunk_bytes: transfers move in chunks of this many bytes, a receive's reduction of chunk k
// overlapping the transfer of chunk k+1, as the executor pipelines them (0: whole messages).
#define COMMLIB_SIM_TOPOLOGY_FIELDS(X)                     \
  X(std::vector<int>, host_of, {}, Need, Placement)        \
  X(std::vector<int>, nic_of, {}, Need, Placement)         \
  X(int, nics_per_host, 1, Need, AtLeast1)                 \
  X(double, intra_latency_s, 0, Need, NonNeg)              \
  X(double, intra_port_Bps, 0, Need, Pos)                  \
  X(double, intra_bus_Bps, 0, Need, NonNeg)                \
  X(double, inter_latency_s, 0, Need, NonNeg)              \
  X(double, nic_Bps, 0, Need, PosAcross)                   \
  X(double, reduce_s_per_byte, 0, Need, NonNeg)            \
  X(double, copy_s_per_byte, 0, Need, NonNeg)              \
  X(double, op_overhead_s, 0, Need, NonNeg)                \
  X(double, step_overhead_s, 0, Need, NonNeg)              \
  X(double, send_overhead_s, 0, Opt, NonNeg)               \
  X(double, recv_overhead_s, 0, Opt, NonNeg)               \
  X(double, nic_gap_s, 0, Opt, NonNeg)                     \
  X(int, intra_by_device, 0, Opt, Flag)                    \
  X(double, nic_burst_bytes, 0, Opt, NonNeg)               \
  X(int, cores_per_host, 0, Opt, Natural)                  \
  X(double, sched_quantum_s, 0, Opt, NonNeg)               \
  X(double, spin_s, 0, Opt, NonNeg)                        \
  X(double, wake_s, 0, Opt, NonNeg)                        \
  X(double, inter_spin_s, -1, Opt, Free)                   \
  X(int64_t, chunk_bytes, 0, Need, Natural)

// Memory hierarchy (Topology::memory_tiers, Opt; empty: one tier, the rates above for any size).
// A rank whose working set -- its input, output (out of place) and scratch buffers -- exceeds a
// tier's above_bytes has left the level of memory before it: its port, copies and reductions run at
// that tier's rates (the last such tier: a larger cache, then DRAM or HBM). Tiers are in ascending
// above_bytes (checked); every field of a tier is Need.
#define COMMLIB_SIM_MEMORY_TIER_FIELDS(X)          \
  X(int64_t, above_bytes, 0, Need, Ascending)      \
  X(double, port_Bps, 0, Need, Pos)                \
  X(double, reduce_s_per_byte, 0, Need, NonNeg)    \
  X(double, copy_s_per_byte, 0, Need, NonNeg)

#define COMMLIB_SIM_DECLARE_FIELD(type, name, init, dict, check) type name = init;

struct Topology {
  COMMLIB_SIM_TOPOLOGY_FIELDS(COMMLIB_SIM_DECLARE_FIELD)
  struct MemoryTier {
    COMMLIB_SIM_MEMORY_TIER_FIELDS(COMMLIB_SIM_DECLARE_FIELD)
  };
  std::vector<MemoryTier> memory_tiers;

  int size() const { return static_cast<int>(host_of.size()); }
  int hosts() const;
  // Throws std::invalid_argument naming the first bad field.
  void validate() const;
};

}  // namespace sim
}  // namespace commlib
