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

A JSON topology file holds the same fields (see docs/simulator.md)::

    {"name": "my-cluster", "base": "eth-100g", "devices_per_host": 4, "nic_Gbps": 200}

``base`` (optional) starts from a preset; any field given overrides it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

__all__ = ["Topology", "PRESETS", "load", "from_bench", "TopologyError"]


class TopologyError(ValueError):
    """A topology name, file or field is invalid; the message names which."""


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
    sources: dict = field(default_factory=dict, compare=False)

    def engine_dict(self, ranks: int) -> dict:
        """The parameters for ``_C.simulate`` placed on ``ranks`` ranks (filled host by host)."""
        if ranks < 1:
            raise TopologyError(f"ranks: must be >= 1, got {ranks}")
        d = self.devices_per_host
        inv = lambda gbps: 0.0 if math.isinf(gbps) else 1.0 / (gbps * 1e9)  # noqa: E731
        return {
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
        }

    def describe(self) -> str:
        return (f"{self.name}: {self.devices_per_host} devices/host, intra {self.intra_GBps:g} GB/s x "
                f"{self.intra_efficiency:g}, {self.intra_latency_us:g} us; {self.nics} x {self.nic_Gbps:g} Gb/s "
                f"NICs x {self.nic_efficiency:g}, {self.inter_latency_us:g} us; reduce {self.reduce_GBps:g} GB/s")

    def as_json(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in d.items()}


_NVLINK_EFF_SRC = ("NCCL's topology model (src/graph/topo.h) credits {per} GB/s per NVLink of {gen}'s "
                   "25 GB/s per direction: {eff:.3f}")

PRESETS = {
    "dgx-h100": Topology(
        name="dgx-h100", devices_per_host=8,
        intra_GBps=450.0, intra_efficiency=20.6 / 25.0, intra_latency_us=2.0,
        nics=8, nic_Gbps=400.0, nic_efficiency=0.97, inter_latency_us=5.0,
        reduce_GBps=3350.0 / 3, chunk_bytes=512 << 10,
        sources={
            "devices_per_host": "NVIDIA DGX H100 user guide: 8x H100 SXM5",
            "intra_GBps": "H100 SXM datasheet: NVLink 4, 900 GB/s bidirectional = 18 links x 25 GB/s per direction, "
                          "all GPUs on 4 NVSwitch chips (non-blocking)",
            "intra_efficiency": _NVLINK_EFF_SRC.format(per=20.6, gen="NVLink 4", eff=20.6 / 25),
            "intra_latency_us": "assumed: a few us per NCCL step on NVLink (nccl-tests small-message all_reduce "
                                "on 8 GPUs is ~10-20 us for ~2 log P.. 2(P-1) steps)",
            "nics": "DGX H100 user guide: 8x ConnectX-7 (one per GPU, rail-optimised)",
            "nic_Gbps": "ConnectX-7: 400 Gb/s InfiniBand NDR per port",
            "nic_efficiency": "InfiniBand NDR data rate after encoding and headers (~48.5 of 50 GB/s)",
            "inter_latency_us": "assumed: InfiniBand switch hop + NIC + proxy thread, ~5 us",
            "reduce_GBps": "H100 SXM HBM3 3.35 TB/s; a reduction reads two operands and writes one (3 bytes of "
                           "traffic per byte reduced)",
            "chunk_bytes": "NCCL default buffer 4 MiB (NCCL_BUFFSIZE) in NCCL_STEPS = 8 slots: 512 KiB per step",
        }),
    "dgx-a100": Topology(
        name="dgx-a100", devices_per_host=8,
        intra_GBps=300.0, intra_efficiency=20.0 / 25.0, intra_latency_us=2.0,
        nics=8, nic_Gbps=200.0, nic_efficiency=0.97, inter_latency_us=5.0,
        reduce_GBps=2039.0 / 3, chunk_bytes=512 << 10,
        sources={
            "devices_per_host": "NVIDIA DGX A100 user guide: 8x A100 SXM4 80GB",
            "intra_GBps": "A100 datasheet: NVLink 3, 600 GB/s bidirectional = 12 links x 25 GB/s per direction, "
                          "6 NVSwitch chips",
            "intra_efficiency": _NVLINK_EFF_SRC.format(per=20.0, gen="NVLink 3", eff=20.0 / 25),
            "intra_latency_us": "assumed, as dgx-h100",
            "nics": "DGX A100 user guide: 8x ConnectX-6 for the compute fabric",
            "nic_Gbps": "ConnectX-6: 200 Gb/s InfiniBand HDR",
            "nic_efficiency": "as dgx-h100",
            "inter_latency_us": "assumed, as dgx-h100",
            "reduce_GBps": "A100 80GB HBM2e 2,039 GB/s / 3 bytes of traffic per byte reduced",
            "chunk_bytes": "as dgx-h100",
        }),
}
for _gbps in (25, 100):
    PRESETS[f"eth-{_gbps}g"] = Topology(
        name=f"eth-{_gbps}g", devices_per_host=1,
        intra_GBps=10.0, intra_efficiency=1.0, intra_latency_us=1.0,
        nics=1, nic_Gbps=float(_gbps), nic_efficiency=0.94, inter_latency_us=25.0,
        reduce_GBps=10.0, op_overhead_us=2.0, chunk_bytes=256 << 10,
        sources={
            "devices_per_host": "one rank per host (a CPU process per server)",
            "nic_Gbps": f"{_gbps} GbE NIC",
            "nic_efficiency": "TCP/IPv4 over Ethernet at 1500 MTU: 1448 payload bytes per 1538 on the wire",
            "inter_latency_us": "assumed: kernel TCP round trip through one switch, ~25 us one way",
            "reduce_GBps": "assumed: one core's vectorised float32 sum out of DRAM, ~10 GB/s",
            "op_overhead_us": "assumed: a send/recv system call pair, ~2 us",
            "intra_GBps": "unused with one rank per host",
            "chunk_bytes": "commlib's shared-memory slot size (transport/shm.cc)",
        })


def _from_fields(fields: dict, where: str, base: Topology | None = None) -> Topology:
    names = {f.name: f for f in dataclasses.fields(Topology)}
    known = set(names) - {"sources"}
    values = dataclasses.asdict(base) if base else {}
    for key, v in fields.items():
        if key in ("base", "comment", "sources"):
            continue
        if key not in known:
            raise TopologyError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        want = names[key].type
        if key == "name":
            if not isinstance(v, str) or not v:
                raise TopologyError(f"{where}: field 'name' must be a non-empty string")
        elif want == "int" or key in ("devices_per_host", "nics", "chunk_bytes"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TopologyError(f"{where}: field {key!r} must be an integer, got {v!r}")
        else:
            if v is None and key in ("reduce_GBps", "copy_GBps"):
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
                 "step_overhead_us", "call_overhead_us", "chunk_bytes"):
        v = getattr(t, name)
        if not v >= 0 or math.isinf(v):
            bad(name, "must be a finite number >= 0")
    for name in ("intra_efficiency", "nic_efficiency"):
        if not 0 < getattr(t, name) <= 1:
            bad(name, "must be in (0, 1]")


def from_bench(path: str, world_size: int | None = None, collectives=None) -> Topology:
    """This machine as one host, fitted to the commlib rows of a bench JSON file: a fixed cost per
    call plus alpha-beta-gamma, each row's (a, b, c) from its schedule (relative least squares).
    alpha becomes the per-message latency, 1/beta the per-rank port bandwidth, 1/gamma the reduction
    rate, with the shared-memory transport's chunking; the fit is the one of ``world_size`` ranks
    (default: the largest in the file), over the rows of ``collectives`` (default: all)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise TopologyError(f"fitted:{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise TopologyError(f"fitted:{path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise TopologyError(f"fitted:{path}: not a commlib bench JSON file (no 'results' list)")
    rows = [r for r in data["results"] if collectives is None or r.get("collective") in collectives]
    rows = [r for r in rows if r.get("backend") == "commlib" and r.get("algorithm") != "auto"
            and (world_size is None or r.get("world_size") == world_size)]
    if not rows:
        raise TopologyError(f"fitted:{path}: no commlib measurements to fit"
                            + (f" at {world_size} ranks" if world_size else ""))
    P = max(r["world_size"] for r in rows)
    rows = [r for r in rows if r["world_size"] == P]
    call, alpha, beta, gamma, err = _fit_machine(rows)
    slot = 256 << 10
    src = f"fitted from {os.path.basename(path)} (commlib, {rows[0].get('transport', '?')}, {P} ranks, {len(rows)} rows)"
    return Topology(
        name=f"fitted:{os.path.basename(path)}", devices_per_host=max(P, 1),
        intra_latency_us=alpha * 1e6, call_overhead_us=call * 1e6,
        intra_GBps=(1.0 / beta / 1e9) if beta > 0 else 1e6,
        reduce_GBps=(1.0 / gamma / 1e9) if gamma > 0 else math.inf,
        chunk_bytes=slot,
        sources={"intra_latency_us": src + ": alpha", "intra_GBps": src + ": 1/beta",
                 "reduce_GBps": src + ": 1/gamma", "call_overhead_us": src + ": fixed cost per call",
                 "chunk_bytes": "shared-memory slot size (transport/shm.cc)", "fit_rel_err_median": err})


def _fit_machine(rows):
    """(call, alpha, beta, gamma, median relative error): non-negative least squares of relative
    error, T = call + a*alpha + b*beta + c*gamma with (a, b, c) from each row's schedule."""
    import numpy as np
    from commlib.bench import model
    A, t = [], []
    for r in rows:
        sec = r["time_us"]["median"] * 1e-6
        if sec <= 0:
            continue
        A.append((1.0,) + tuple(model.coefficients(r["collective"], r["algorithm"], r["bytes"], r["world_size"])))
        t.append(sec)
    A, t = np.array(A), np.array(t)
    scale = np.where(np.abs(A).max(axis=0) > 0, np.abs(A).max(axis=0), 1.0)
    x = model._nnls_small(A / scale / t[:, None], np.ones_like(t)) / scale
    rel = np.abs(A @ x - t) / t
    return float(x[0]), float(x[1]), float(x[2]), float(x[3]), float(np.median(rel))


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
