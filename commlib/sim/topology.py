"""Topologies for the simulator: presets from datasheets, a JSON format, and this machine fitted
from a ``commlib bench --json`` run.

A topology is hosts x devices (one rank per device). Inside a host every device has a port of
``intra_GBps`` per direction (NVLink into NVSwitch; a core's copy bandwidth on shared memory), and
optionally all intra-host traffic shares one bus (``bus_GBps``: memory bandwidth). Between hosts
every host has ``nics`` NICs of ``nic_Gbps`` per direction behind a non-blocking fabric; device i
of a host uses NIC ``i % nics`` (rail-optimised, as DGX systems are cabled).

Datasheet rates are never reached by real transfers; the fraction that is (headers, flow control,
protocol) is an explicit named parameter per link kind (``intra_efficiency``, ``nic_efficiency``),
as are software overheads (``op_overhead_us`` per send/receive posted, ``step_overhead_us`` per
schedule step, ``call_overhead_us`` per collective call). Every preset records where each number comes from in ``sources``.

CPU scheduling (all 0 in the presets: a core per rank, no sleeping): ``cores_per_host`` cores
shared by a host's ranks (0: one per rank); a host with more ranks than cores runs its software
costs that many times slower and every receive there pays ``wake_us`` plus a share of
``sched_quantum_us`` waiting for a core. Elsewhere a receiver spins ``spin_us`` for its message
and, if it must wait longer, sleeps and pays ``wake_us`` (docs/simulator.md, "Waiting"). A wait on
a message from another host spins ``inter_spin_us`` instead (when >= 0), offering the core between
polls as commlib's TCP wait does: within it no wake-up is paid, even on an oversubscribed host.

Memory hierarchy: ``memory_tiers`` is a list of ``{"above_bytes", "intra_GBps", "reduce_GBps",
"copy_GBps"}`` in ascending ``above_bytes``. A device whose working set (its input, output and
scratch buffers) exceeds a tier's ``above_bytes`` moves, copies and reduces at that tier's rates
(the last such tier's) instead of the in-cache ``intra_GBps``, ``reduce_GBps`` and ``copy_GBps``;
a rate left out or null is the tier before's. No tiers: one set of rates for every size.

A JSON topology file holds the same fields (see docs/simulator.md)::

    {"name": "my-cluster", "base": "eth-100g", "devices_per_host": 4, "nic_Gbps": 200}

``base`` (optional) starts from a preset; any field given overrides it.
"""
from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import json
import math
import os

from commlib.sim.topology_model import Topology, TopologyError

__all__ = ["Topology", "PRESETS", "load", "TopologyError"]


def _dgx(name, *, gpu, nvlink, port_GBps, links, switches, credited_GBps, nic, nic_Gbps, ib, hbm, hbm_GBps,
         l2_MB, msg_rate_M, chunk_bytes=512 << 10) -> Topology:
    """A DGX node: 8 GPUs on NVSwitch, one NIC per GPU; every number below names its source."""
    return Topology(
        name=name, devices_per_host=8,
        intra_GBps=port_GBps, intra_efficiency=credited_GBps / 25.0, intra_latency_us=0.2,
        nics=8, nic_Gbps=nic_Gbps, nic_efficiency=0.97, inter_latency_us=0.7,
        reduce_GBps=hbm_GBps / 3, chunk_bytes=chunk_bytes,
        call_overhead_us=3.6, send_overhead_us=0.1, recv_overhead_us=0.1,
        nic_gap_us=1.0 / msg_rate_M, intra_by_device=1,
        sources={
            "call_overhead_us": "NCCL's tuning model (src/graph/tuning.cc, baseLat ring LL): 3.6 us per call",
            "intra_latency_us": "NCCL's tuning model (src/graph/tuning.cc, hwLat NVLink ring LL): 0.4 us per ring "
                                "step, of which 0.1 + 0.1 us are the send and receive overheads: 0.2 us",
            "inter_latency_us": "NCCL's tuning model (src/graph/tuning.cc, hwLat NET ring LL): 0.9 us per step "
                                "between nodes, less the 0.2 us of send and receive overheads: 0.7 us",
            "send_overhead_us": "derived: a quarter of NCCL's 0.4 us NVLink ring LL step (tuning.cc hwLat) per "
                                "message posted, one after another (LogGP o)",
            "recv_overhead_us": "derived: as send_overhead_us, per message taken in",
            "intra_by_device": "NCCL's NVLink transfers are copies by the GPU's SMs (one thread block per channel, "
                               "in parallel), not CPU work; its proxy thread posts and completes network messages "
                               "only (src/transport/net.cc): NVLink messages' overheads are their own, off the CPU",
            "nic_gap_us": f"{nic} message rate, up to {msg_rate_M:g} million messages/s (NVIDIA product brief): "
                          "one message per 1/rate per direction",
            "devices_per_host": f"NVIDIA {name.upper().replace('-', ' ')} user guide: 8x {gpu}",
            "intra_GBps": f"{gpu} datasheet: {nvlink}, {2 * port_GBps:g} GB/s bidirectional = {links} links x 25 GB/s "
                          f"per direction, all GPUs on {switches} NVSwitch chips (non-blocking)",
            "intra_efficiency": f"NCCL's topology model (src/graph/topo.h) credits {credited_GBps:g} GB/s per NVLink "
                                f"of {nvlink}'s 25 GB/s per direction: {credited_GBps / 25:.3f}",
            "nics": f"{name.upper().replace('-', ' ')} user guide: 8x {nic} (one per GPU, rail-optimised)",
            "nic_Gbps": f"{nic}: {nic_Gbps:g} Gb/s InfiniBand {ib} per port",
            "nic_efficiency": "InfiniBand data rate after encoding and headers (~48.5 of 50 GB/s on NDR)",
            "reduce_GBps": f"{gpu} {hbm} {hbm_GBps:g} GB/s; a reduction reads two operands and writes one "
                           "(3 bytes of traffic per byte reduced)",
            "chunk_bytes": "NCCL default buffer 4 MiB (NCCL_BUFFSIZE) in NCCL_STEPS = 8 slots: 512 KiB per step",
            "memory_tiers": f"not modelled (none): {hbm} ({hbm_GBps:g} GB/s) outruns the NVLink port "
                           f"({port_GBps:g} GB/s) whether or not data sits in the {l2_MB} MB L2, and reduce_GBps "
                           f"is already the {hbm} (beyond-cache) rate",
        })


PRESETS = {
    "dgx-h100": _dgx("dgx-h100", gpu="H100 SXM5", nvlink="NVLink 4", port_GBps=450.0, links=18, switches=4,
                     credited_GBps=20.6, nic="ConnectX-7", nic_Gbps=400.0, ib="NDR", hbm="HBM3",
                     hbm_GBps=3350.0, l2_MB=50, msg_rate_M=330.0),
    "dgx-a100": _dgx("dgx-a100", gpu="A100 SXM4 80GB", nvlink="NVLink 3", port_GBps=300.0, links=12, switches=6,
                     credited_GBps=20.0, nic="ConnectX-6", nic_Gbps=200.0, ib="HDR", hbm="HBM2e",
                     hbm_GBps=2039.0, l2_MB=40, msg_rate_M=215.0),
}
for _gbps in (25, 100):
    PRESETS[f"eth-{_gbps}g"] = Topology(
        name=f"eth-{_gbps}g", devices_per_host=1,
        intra_GBps=10.0, intra_efficiency=1.0, intra_latency_us=1.0,
        nics=1, nic_Gbps=float(_gbps), nic_efficiency=0.94, inter_latency_us=25.0,
        reduce_GBps=10.0, send_overhead_us=1.0, recv_overhead_us=1.0, chunk_bytes=256 << 10,
        nic_gap_us=84 * 8 / (_gbps * 1e3),
        sources={
            "send_overhead_us": "assumed (as the former 2 us op_overhead_us, a send/recv system call pair): 1 us "
                                "of CPU per send, taken one after another",
            "recv_overhead_us": "assumed: 1 us of CPU per message received (the other system call of the pair)",
            "nic_gap_us": f"Ethernet framing: a minimum frame occupies 84 bytes on the wire (64 + preamble 8 + "
                          f"inter-frame gap 12), so a {_gbps} GbE port starts at most {_gbps * 1e3 / 672:.1f} M "
                          "messages/s",
            "devices_per_host": "one rank per host (a CPU process per server)",
            "nic_Gbps": f"{_gbps} GbE NIC",
            "nic_efficiency": "TCP/IPv4 over Ethernet at 1500 MTU: 1448 payload bytes per 1538 on the wire",
            "inter_latency_us": "assumed: kernel TCP round trip through one switch, ~25 us one way",
            "reduce_GBps": "assumed: one core's vectorised float32 sum out of DRAM, ~10 GB/s",
            "intra_GBps": "unused with one rank per host",
            "chunk_bytes": "commlib's shared-memory slot size (transport/shm.cc)",
            "memory_tiers": "not modelled (none): one rank per host has no intra-host transfers, and reduce_GBps "
                           "is already the out-of-cache (DRAM) rate",
        })

_INT_FIELDS = {"devices_per_host", "nics", "chunk_bytes", "cores_per_host", "intra_by_device"}
_NULL_IS_FREE = {"reduce_GBps", "copy_GBps"}  # null: infinitely fast
_TIER_RATES = ("intra_GBps", "reduce_GBps", "copy_GBps")


def _tiers(v, where: str) -> tuple:
    """memory_tiers from JSON: a list of objects, checked field by field (names in the errors)."""
    if not isinstance(v, (list, tuple)):
        raise TopologyError(f"{where}: field 'memory_tiers' must be a list of objects, got {v!r}")
    out, last = [], 0
    for i, m in enumerate(v):
        at = f"{where}: memory_tiers[{i}]"
        if not isinstance(m, Mapping):
            raise TopologyError(f"{at} must be an object, got {m!r}")
        unknown = set(m) - {"above_bytes", *_TIER_RATES}
        if unknown:
            raise TopologyError(f"{at}: unknown field(s) {', '.join(sorted(unknown))} (known: above_bytes, "
                                f"{', '.join(_TIER_RATES)})")
        b = m.get("above_bytes")
        if isinstance(b, bool) or not isinstance(b, int) or b <= last:
            raise TopologyError(f"{at}.above_bytes must be an integer > 0 and above the tier before's, got {b!r}")
        last = b
        tier = {"above_bytes": b}
        for k in _TIER_RATES:
            r = m.get(k)
            if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not r > 0
                                  or math.isinf(r)):
                raise TopologyError(f"{at}.{k} must be a number > 0 (or null: the tier before's), got {r!r}")
            tier[k] = None if r is None else float(r)
        out.append(tier)
    return tuple(out)


def _from_fields(fields: dict, where: str, base: Topology | None = None) -> Topology:
    known = {f.name for f in dataclasses.fields(Topology)} - {"sources"}
    values = dataclasses.asdict(base) if base else {}
    for key, v in fields.items():
        if key in ("base", "comment", "sources"):
            continue
        if key not in known:
            raise TopologyError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        if key == "name":
            if not isinstance(v, str) or not v:
                raise TopologyError(f"{where}: field 'name' must be a non-empty string")
        elif key in _INT_FIELDS:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TopologyError(f"{where}: field {key!r} must be an integer, got {v!r}")
        elif key == "memory_tiers":
            v = _tiers(v, where)
        else:
            if v is None and key in _NULL_IS_FREE:
                v = math.inf
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise TopologyError(f"{where}: field {key!r} must be a number, got {v!r}")
            v = float(v)
        values[key] = v
    values.setdefault("name", os.path.basename(where))
    missing = [k for k in ("devices_per_host", "intra_latency_us", "intra_GBps") if k not in values]
    if missing:
        raise TopologyError(f"{where}: missing field(s) {', '.join(missing)} (or give a 'base' preset)")
    if "sources" in fields and isinstance(fields["sources"], dict):
        values["sources"] = dict(values.get("sources") or {}, **fields["sources"])
    topo = Topology(**values)
    _check(topo, where)
    return topo


def _check(t: Topology, where: str):
    def bad(name, rule):
        raise TopologyError(f"{where}: field {name!r} {rule}, got {getattr(t, name)!r}")
    if t.devices_per_host < 1:
        bad("devices_per_host", "must be >= 1")
    if t.nics < 1:
        bad("nics", "must be >= 1")
    for name in ("intra_GBps", "reduce_GBps", "copy_GBps"):
        if not getattr(t, name) > 0:
            bad(name, "must be > 0")
    for name in ("intra_latency_us", "inter_latency_us", "bus_GBps", "nic_Gbps", "op_overhead_us",
                 "step_overhead_us", "call_overhead_us", "chunk_bytes", "cores_per_host", "sched_quantum_us",
                 "spin_us", "wake_us"):
        v = getattr(t, name)
        if not v >= 0 or math.isinf(v):
            bad(name, "must be a finite number >= 0")
    for name in ("intra_efficiency", "nic_efficiency"):
        if not 0 < getattr(t, name) <= 1:
            bad(name, "must be in (0, 1]")
    if t.intra_by_device not in (0, 1):
        bad("intra_by_device", "must be 0 or 1")
    _tiers(list(t.memory_tiers), where)


def load(spec) -> Topology:
    """A Topology from a preset name, ``fitted:<bench.json>``, a JSON file path, or a Topology."""
    if isinstance(spec, Topology):
        return spec
    if not isinstance(spec, str) or not spec:
        raise TopologyError(f"topology: expected a preset name ({', '.join(PRESETS)}), a JSON file or "
                            f"fitted:<bench.json>, got {spec!r}")
    if spec in PRESETS:
        return PRESETS[spec]
    if spec.startswith("fitted:"):
        from commlib.sim.fit import from_bench
        return from_bench(spec[len("fitted:"):])
    if not os.path.exists(spec):
        raise TopologyError(f"topology: {spec!r} is neither a preset ({', '.join(PRESETS)}) nor an existing "
                            f"file")
    try:
        with open(spec) as f:
            fields = json.load(f)
    except json.JSONDecodeError as e:
        raise TopologyError(f"{spec}: not valid JSON ({e})") from None
    if not isinstance(fields, dict):
        raise TopologyError(f"{spec}: a topology file holds one JSON object")
    base = None
    if "base" in fields:
        if fields["base"] not in PRESETS:
            raise TopologyError(f"{spec}: field 'base' must name a preset ({', '.join(PRESETS)}), "
                                f"got {fields['base']!r}")
        base = PRESETS[fields["base"]]
    return _from_fields(fields, spec, base)
