"""The Topology record and its error, apart from commlib/sim/topology.py (presets, JSON files, and
``load``, which hands ``fitted:`` specs to commlib/sim/fit.py): the fit builds Topology records
without importing the loader that calls it. The fields are described in topology.py's docstring.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field


class TopologyError(ValueError):
    """A topology name, file or field is invalid; the message names which."""


class MemoryTier(Mapping):
    """One entry of ``Topology.memory_tiers``: a read-only mapping (``above_bytes`` and the rates),
    hashable so that a Topology with tiers can key a cache or a set like one without."""

    def __init__(self, fields):
        self._items = tuple(sorted(dict(fields).items()))

    def __getitem__(self, key):
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(self._items)

    def __repr__(self):
        return repr(dict(self._items))


@dataclass(frozen=True)
class Topology:
    """A modelled cluster; see the module docstring for the meaning of each field."""

    name: str
    devices_per_host: int
    intra_latency_us: float
    intra_GBps: float
    intra_efficiency: float = 1.0
    bus_GBps: float = 0.0
    nics: int = 1
    nic_Gbps: float = 0.0
    nic_efficiency: float = 1.0
    inter_latency_us: float = 0.0
    reduce_GBps: float = math.inf   # bytes reduced per second by one device
    copy_GBps: float = math.inf     # bytes copied locally per second by one device
    op_overhead_us: float = 0.0
    step_overhead_us: float = 0.0
    call_overhead_us: float = 0.0   # per collective call (API, argument checks, launch), added once
    chunk_bytes: int = 0            # pipelining granularity of transfers with reductions (0: none)
    # CPU scheduling (docs/simulator.md, "Waiting"); zeros: every rank has a core and never sleeps
    cores_per_host: int = 0         # cores a host's ranks share (0: one per rank)
    sched_quantum_us: float = 0.0   # an oversubscribed host: a woken rank waits (ranks/cores - 1) x this for a core
    spin_us: float = 0.0            # a receiver spins this long for its message before it sleeps
    wake_us: float = 0.0            # a sleeping receiver is running again this long after its message arrives
    inter_spin_us: float = -1.0     # a wait on another host spins this long, yielding (TCP); < 0: spin_us, not yielding
    # Per-message costs (LogGP's o and g, docs/simulator.md "Messages"); zeros: none
    send_overhead_us: float = 0.0   # a rank's CPU time per send posted (its sends go one after another)
    recv_overhead_us: float = 0.0   # a rank's CPU time per message taken in
    nic_gap_us: float = 0.0         # a NIC starts at most one message per gap in each direction
    nic_burst_KiB: float = 0.0      # a token bucket on each NIC direction (tc tbf's burst); 0: none
    intra_by_device: int = 0        # 1: messages inside a host are the devices' (GPU kernels), off the CPU
    memory_tiers: tuple = ()        # ({"above_bytes", "intra_GBps", "reduce_GBps", "copy_GBps"}, ...)
    sources: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        # Tiers arrive as dicts (JSON, the fit, callers); frozen and hashable from here on.
        object.__setattr__(self, "memory_tiers", tuple(MemoryTier(m) for m in self.memory_tiers))

    def engine_dict(self, ranks: int) -> dict:
        """The parameters for ``_C.simulate`` placed on ``ranks`` ranks (filled host by host)."""
        if ranks < 1:
            raise TopologyError(f"ranks: must be >= 1, got {ranks}")
        d = self.devices_per_host
        inv = lambda gbps: 0.0 if math.isinf(gbps) else 1.0 / (gbps * 1e9)  # noqa: E731
        tiers = [{"above_bytes": int(m["above_bytes"]), "port_Bps": m["intra_GBps"] * 1e9 * self.intra_efficiency,
                  "reduce_s_per_byte": inv(m["reduce_GBps"]), "copy_s_per_byte": inv(m["copy_GBps"])}
                 for m in self.resolved_tiers()]
        return {"memory_tiers": tiers} | {
            "host_of": [r // d for r in range(ranks)],
            "nic_of": [(r % d) % self.nics for r in range(ranks)],
            "nics_per_host": self.nics,
            "intra_latency_s": self.intra_latency_us * 1e-6,
            "intra_port_Bps": self.intra_GBps * 1e9 * self.intra_efficiency,
            "intra_bus_Bps": self.bus_GBps * 1e9,
            "inter_latency_s": self.inter_latency_us * 1e-6,
            "nic_Bps": self.nic_Gbps / 8 * 1e9 * self.nic_efficiency,
            "reduce_s_per_byte": inv(self.reduce_GBps),
            "copy_s_per_byte": inv(self.copy_GBps),
            "op_overhead_s": self.op_overhead_us * 1e-6,
            "step_overhead_s": self.step_overhead_us * 1e-6,
            "chunk_bytes": int(self.chunk_bytes),
            "cores_per_host": int(self.cores_per_host),
            "sched_quantum_s": self.sched_quantum_us * 1e-6,
            "spin_s": self.spin_us * 1e-6,
            "inter_spin_s": self.inter_spin_us * 1e-6 if self.inter_spin_us >= 0 else -1.0,
            "wake_s": self.wake_us * 1e-6,
            "send_overhead_s": self.send_overhead_us * 1e-6,
            "recv_overhead_s": self.recv_overhead_us * 1e-6,
            "nic_gap_s": self.nic_gap_us * 1e-6,
            "nic_burst_bytes": self.nic_burst_KiB * 1024.0,
            "intra_by_device": int(self.intra_by_device),
        }

    def resolved_tiers(self) -> list:
        """The memory tiers with every rate filled in (a missing or null rate: the tier before's)."""
        prev = {"intra_GBps": self.intra_GBps, "reduce_GBps": self.reduce_GBps, "copy_GBps": self.copy_GBps}
        out = []
        for m in self.memory_tiers:
            prev = dict(prev, **{k: m[k] for k in prev if m.get(k) is not None})
            out.append(dict(prev, above_bytes=m["above_bytes"]))
        return out

    def describe(self) -> str:
        text = (f"{self.name}: {self.devices_per_host} devices/host, intra {self.intra_GBps:g} GB/s x "
                f"{self.intra_efficiency:g}, {self.intra_latency_us:g} us; {self.nics} x {self.nic_Gbps:g} Gb/s "
                f"NICs x {self.nic_efficiency:g}, {self.inter_latency_us:g} us; reduce {self.reduce_GBps:g} GB/s")
        if self.cores_per_host or self.wake_us or self.sched_quantum_us:
            cores = f"{self.cores_per_host} cores per host" if self.cores_per_host else "a core per rank"
            spin = f"spin {self.spin_us:g} us" + (f" ({self.inter_spin_us:g} us yielding between hosts)"
                                                  if self.inter_spin_us >= 0 else "")
            text += (f"; {cores}, {spin}, wake-up {self.wake_us:g} us, "
                     f"quantum {self.sched_quantum_us:g} us")
        for m in self.resolved_tiers():
            text += (f"; beyond {m['above_bytes']} B per device: intra {m['intra_GBps']:g} GB/s, reduce "
                     f"{m['reduce_GBps']:g} GB/s, copy {m['copy_GBps']:g} GB/s")
        return text

    def as_json(self) -> dict:
        d = dataclasses.asdict(self)
        free = lambda v: None if isinstance(v, float) and math.isinf(v) else v  # noqa: E731
        d["memory_tiers"] = [{k: free(v) for k, v in m.items()} for m in self.memory_tiers]
        return {k: free(v) for k, v in d.items()}
