"""Predictions: the simulator engine (csrc/sim) run on the registry's schedules, as bench records.

    >>> from commlib import sim
    >>> r = sim.predict("all_reduce", "ring", 1 << 30, 8, "dgx-h100")
    >>> round(r["busbw_GBps"])          # doctest: +SKIP
    367

A record has the fields of a ``commlib bench`` record (collective, algorithm, resolved,
world_size, dtype, bytes, count, time_us, algbw_GBps, busbw_GBps, ...) with ``backend`` "sim" and
``transport`` the topology's name, so the report and the tuner read both alike.
"""
from __future__ import annotations

import commlib._C as _C
from commlib.core import codecs, schedules
from commlib.core.call_spec import COLLECTIVE
from commlib.perf import common as C
from commlib.sim.topology import Topology, load

__all__ = ["predict", "sweep", "algorithms_for", "split_phases", "phases_label"]

SCHEMA = "commlib-sim/1"


def algorithms_for(collective: str, requested) -> list:
    """The algorithm list of a ``--algorithm`` value: 'all' -> every registered one a communicator
    runs (one-sided schedules, O(P^2) signals each, are costed when named)."""
    if isinstance(requested, str):
        requested = [a.strip() for a in requested.split(",") if a.strip()]
    out = []
    for a in requested:
        out.extend(schedules.algorithms(collective) if a == "all" else [a])
    return list(dict.fromkeys(out))


def split_phases(algorithm: str) -> tuple:
    """``hierarchical/<inter>[/<intra>]`` -> ("hierarchical", inter, intra): the hierarchical schedule
    with a registered algorithm across hosts (and inside them); ``rail_split/<inter>[/<intra>]`` the
    same for rail_split's hierarchical part; any other name -> (name, "", "")."""
    parts = algorithm.split("/")
    if len(parts) == 1:
        return algorithm, "", ""
    if parts[0] not in ("hierarchical", "rail_split") or len(parts) > 3 or not all(parts[1:]):
        raise ValueError(f"algorithm: {algorithm!r}: only hierarchical/<inter>[/<intra>] or "
                         "rail_split/<inter>[/<intra>] names phases")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def phases_label(algorithm: str, inter: str, intra: str) -> str:
    """split_phases' inverse: the name a table or record shows for a resolved choice."""
    return "/".join([algorithm] + ([inter] if inter else []) + ([intra] if intra else []))


def predict(collective: str, algorithm: str, size: int, ranks: int, topology, dtype: str = "float32",
            root: int = 0, compress=None, codec_ns=(-1.0, -1.0), piece_bytes: int = -1,
            feedback_ns: float = 0.0) -> dict:
    """Predicted record of one collective of ``size`` bench bytes (nccl-tests sizes: the
    all_reduce buffer, the all_gather output, ...) on ``ranks`` ranks of ``topology``.
    ``algorithm`` may name hierarchical's phases: ``hierarchical/<inter>[/<intra>]`` (split_phases).
    ``compress``: a codec (name or ``commlib.codecs.Codec``) the messages travel in, costed as the
    host lowering runs it (encoded bytes, the codec's compute at ``codec_ns`` = (encode, decode)
    ns per element, negative: the default; docs/compression.md), streamed in pieces of ``piece_bytes``
    of input (-1: COMMLIB_COMPRESS_PIECE_BYTES; 0: whole messages, encoded before they travel).
    ``feedback_ns``: error feedback's pass (DataParallel(error_feedback=True), the DDP hook) over each
    rank's input before the collective, ns per element on one core (0: none; -1: its measured rate)."""
    topo: Topology = load(topology)
    if collective not in C.COLLECTIVES and collective != "barrier":
        raise ValueError(f"collective: unknown {collective!r} (expected one of {', '.join(C.COLLECTIVES)})")
    if dtype not in C.DTYPES:
        raise ValueError(f"dtype: unknown {dtype!r} (expected one of {', '.join(C.DTYPES)})")
    if ranks < 1:
        raise ValueError(f"ranks: must be >= 1, got {ranks}")
    if ranks > topo.devices_per_host and not topo.nic_Gbps > 0:
        raise ValueError(f"ranks: {ranks} needs {-(-ranks // topo.devices_per_host)} hosts, but {topo.name} is one "
                         f"host of {topo.devices_per_host} ranks without NICs (nic_Gbps 0)")
    _, block, real = C.geometry(collective, size, dtype, ranks)
    name, inter, intra = split_phases(algorithm)
    codec = codecs.get(compress)
    if codec is not None and collective not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(f"compress: all_reduce, reduce_scatter and all_gather take it, not {collective}")
    if feedback_ns and codec is None:
        raise ValueError("feedback_ns: error feedback needs compress=")
    if codec is not None and dtype not in codecs.CODED_DTYPES:
        raise ValueError(f"compress: codecs code {', '.join(codecs.CODED_DTYPES)} data, not {dtype}")
    out = _C.simulate(COLLECTIVE[collective], name, block, C.elem_size(dtype), root, topo.engine_dict(ranks), inter,
                      -1, intra, codec.name if codec else "", codec.block_size if codec else 32,
                      bool(codec and codec.inter_only), float(codec_ns[0]), float(codec_ns[1]), int(piece_bytes),
                      feedback_ns=float(feedback_ns))
    seconds = out["time_s"] + topo.call_overhead_us * 1e-6
    algbw, busbw = C.bandwidths(collective, real, ranks, seconds)
    return {
        "backend": "sim", "transport": topo.name, "collective": collective, "algorithm": algorithm,
        "resolved": out["algorithm"], "inter_algorithm": out["inter_algorithm"],
        "intra_algorithm": out["intra_algorithm"], "mode": "out", "world_size": ranks, "dtype": dtype, "op": "sum",
        "root": root if collective in C.ROOTED else -1, "bytes": real, "count": block * (
            ranks if collective in C.BLOCKED else 1),
        "time_us": {"median": seconds * 1e6}, "algbw_GBps": algbw, "busbw_GBps": busbw, "wrong": None,
        "compress": codec.name if codec else None,
        "sim": {k: out[k] for k in ("build_s", "run_s", "steps", "transfers", "bytes_inter", "bytes_intra",
                                    "shapes", "nic_busy_s", "port_busy_s", "cpu_busy_s", "segment", "pieces",
                                    "share")},
    }


def sweep(collective: str, algorithms, topology, ranks_list, sizes, dtype="float32", root=0, on_row=None):
    """Records for every (ranks, size, algorithm); ``on_row(record)`` is called as each arrives."""
    topo = load(topology)
    recs = []
    for P in ranks_list:
        for size in sizes:
            for alg in algorithms_for(collective, algorithms):
                rec = predict(collective, alg, size, P, topo, dtype, root)
                recs.append(rec)
                if on_row:
                    on_row(rec)
    return recs


def pipeline_shape(preset: str, nodes: int, size: int, inter: str, intra: str = "") -> tuple:
    """(segment, pieces) the cost model's policy gives the hierarchical composition for a float32
    all_reduce of `size` bytes on `nodes` hosts of `preset` (policy/pipeline_shape.h; segment 0:
    not pipelined): what auto's candidate of that composition runs."""
    t = load(preset)
    shape = _C.pipeline_shape(_C.Collective.all_reduce, size // 4, 4, t.engine_dict(nodes * t.devices_per_host),
                              inter, intra)
    return shape["segment"], shape["pieces"]


def hierarchical_time(preset: str, nodes: int, size: int, inter: str, intra: str = "", segment: int = -1,
                      fast: str = "", pieces: int = 0) -> float:
    """Seconds of a float32 sum all_reduce of `size` bytes by the hierarchical composition
    (`inter` between hosts, `intra` inside them) on `nodes` hosts of `preset`, with `segment` and
    `pieces` (-1 and 0: COMMLIB_HIER_SEGMENT and the builder's cap; pipeline_shape gives the
    model's). `fast` "nic" or "intra" makes that kind of link 1000x faster and free of latency
    (and, for "intra", the reductions free): the time of the other phase alone, the bound an
    overlapped pipeline approaches (bench/sim_overlap.py, tests/sim/test_overlap_bound.py)."""
    t = load(preset)
    d = t.engine_dict(nodes * t.devices_per_host)
    if fast == "nic":
        d["nic_Bps"] *= 1000
        d["inter_latency_s"] = 0.0
    elif fast == "intra":
        d["intra_port_Bps"] *= 1000
        d["intra_latency_s"] = 0.0
        d["reduce_s_per_byte"] = 0.0
    elif fast:
        raise ValueError(f"fast: 'nic', 'intra' or empty, got {fast!r}")
    return _C.simulate(_C.Collective.all_reduce, "hierarchical", size // 4, 4, 0, d, inter, segment, intra,
                       pieces=pieces)["time_s"]
