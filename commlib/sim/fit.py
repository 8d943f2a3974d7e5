"""``fitted:<bench.json>``: this machine as one host, fitted to the commlib rows of a
``commlib bench --json`` run.

Every row's time is modelled as a fixed cost per call plus alpha-beta-gamma and a copy term, each
row's coefficients coming from its own schedule (``commlib.perf.model.coefficients``, and the
bytes its schedule copies locally)::

    T = call + a*alpha + b*beta + c*gamma + d*delta

with a memory hierarchy: the per-byte rates (beta, gamma, delta) are fitted per level of memory,
a row falling in one level by its working set (its input, output and scratch buffers; the
simulator's own number). The levels' boundaries are chosen among the working sets the bench
measured: every way of cutting the sorted working sets into up to ``MAX_LEVELS`` levels, each with
at least ``MIN_SIZES_PER_LEVEL`` distinct working sets, is searched (non-negative least squares of
the relative error per cut; cuts added greedily, each then moved to its best place), and the cut
with the least error wins; an extra level is kept only if it lowers that error by ``LEVEL_GAIN``
or more. A boundary is the largest working set of the level
below: the real cliff lies between it and the next working set measured (recorded in
``sources``), so a finer bench (``-f 2``) places it more precisely.
"""
from __future__ import annotations

import functools
import json
import math
import os

from commlib.sim.topology_model import Topology, TopologyError

__all__ = ["from_bench", "fit_machine", "working_set_bytes", "MAX_LEVELS", "MIN_SIZES_PER_LEVEL", "LEVEL_GAIN"]

MAX_LEVELS = 3           # in cache + up to two memory tiers (e.g. a private L2, a shared L3, DRAM)
MIN_SIZES_PER_LEVEL = 2  # distinct working sets a level needs for its rates to be fitted
LEVEL_GAIN = 0.10        # an extra level must lower the (capped) squared error by this fraction
# A row the fit misses by more than this (relative) belongs to a regime the model does not describe
# (a call that left the fast path, a burst of load): it is set aside and the fit redone, up to
# REFITS times, so that it does not pull the rates; in choosing the levels it counts as this error.
OUTLIER_REL = 0.5
REFITS = 4


@functools.lru_cache(maxsize=65536)
def working_set_bytes(collective: str, algorithm: str, size: int, dtype: str, ranks: int, root: int = 0) -> int:
    """The largest working set of any rank for one bench row: its input, output (out of place) and
    the schedule's scratch buffer, in bytes; the very number the simulator compares with
    memory tiers' ``above_bytes`` (csrc/sim/simulator.cc)."""
    import commlib._C as _C
    from commlib.core.call_spec import COLLECTIVE
    from commlib.perf import common as C
    from commlib.perf import model
    _, block, _ = C.geometry(collective, size, dtype, ranks)
    topo = model._uniform(ranks, 0.0, model._HUGE_BPS, 0.0)
    return int(_C.simulate(COLLECTIVE[collective], algorithm, block, C.elem_size(dtype), max(root, 0), topo)["max_working_set_bytes"])


@functools.lru_cache(maxsize=65536)
def copy_coefficient(collective: str, algorithm: str, n: int, P: int) -> float:
    """Bytes one rank copies locally on the critical path (the schedule's copy ops), the term
    ``commlib.perf.model.coefficients`` leaves out: T gains d / copy rate."""
    import commlib._C as _C
    from commlib.core.call_spec import COLLECTIVE
    from commlib.perf import model
    if P <= 1:
        return 0.0
    blocked = collective in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
    topo = model._uniform(P, 0.0, model._HUGE_BPS, 0.0)
    topo["copy_s_per_byte"] = 1.0
    d = _C.simulate(COLLECTIVE[collective], algorithm, n // P if blocked else n, 1, 0, topo)["time_s"]
    return d if d > 1e-200 else 0.0


def _read_rows(path: str, world_size, collectives):
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
    return [r for r in rows if r["world_size"] == P], P, data


def from_bench(path: str, world_size: int | None = None, collectives=None, tiers: bool = True) -> Topology:
    """This machine as one host, fitted to the commlib rows of a bench JSON file (module docstring).

    alpha becomes the per-message latency, 1/beta the per-rank port bandwidth, 1/gamma the
    reduction rate, 1/delta the copy rate, and with ``tiers`` the levels beyond the first become
    ``memory_tiers``. The fit is the one of ``world_size`` ranks (default: the largest in the file),
    over the rows of ``collectives`` (default: all). Reductions are not pipelined (``chunk_bytes``
    0): on shared memory the receiving rank reduces straight out of the slot or the sender's
    buffer, in the same loop that moves the bytes, so there is nothing to overlap.

    The host holds as many ranks as the largest world size in the file. Where the file records the machine's cores and
    the fit's ranks fit on them, the ranks beyond them are modelled (``cores_per_host``, and
    ``sched_quantum_us`` fitted if the file has runs with more ranks than cores:
    ``commlib.sim.fit_sched.with_scheduling``)."""
    rows, P, data = _read_rows(path, world_size, collectives)
    host_ranks = max([P] + [r["world_size"] for r in data["results"] if isinstance(r.get("world_size"), int)])
    f = fit_machine(rows, max_levels=MAX_LEVELS if tiers else 1)
    src = (f"fitted from {os.path.basename(path)} (commlib, {rows[0].get('transport', '?')}, {P} ranks, "
           f"{len(rows)} rows)")
    rate = lambda s_per_byte: (1.0 / s_per_byte / 1e9) if s_per_byte > 0 else math.inf  # noqa: E731
    port = lambda s_per_byte: rate(s_per_byte) if s_per_byte > 0 else 1e6  # a port must be finite  # noqa: E731
    first = f["levels"][0]
    memory_tiers = tuple({"above_bytes": lv["above_bytes"],
                          "intra_GBps": None if lv["beta"] is None else port(lv["beta"]),
                          "reduce_GBps": None if lv["gamma"] is None else rate(lv["gamma"]),
                          "copy_GBps": None if lv["delta"] is None else rate(lv["delta"])} for lv in f["levels"][1:])
    cuts = "; ".join(f"a cliff between {lv['above_bytes']} and {lv['next_working_set']} bytes per rank"
                     for lv in f["levels"][1:]) or "one level fitted best (no cliff among the measured sizes)"
    topo = Topology(
        name=f"fitted:{os.path.basename(path)}", devices_per_host=host_ranks,
        intra_latency_us=f["alpha"] * 1e6, call_overhead_us=f["call"] * 1e6, intra_GBps=port(first["beta"] or 0.0),
        reduce_GBps=rate(first["gamma"] or 0.0), copy_GBps=rate(first["delta"] or 0.0), chunk_bytes=0,
        memory_tiers=memory_tiers,
        sources={"intra_latency_us": src + ": alpha", "intra_GBps": src + ": 1/beta",
                 "reduce_GBps": src + ": 1/gamma", "copy_GBps": src + ": 1/delta (local copies of the schedules)",
                 "call_overhead_us": src + ": fixed cost per call",
                 "chunk_bytes": "0: a shared-memory receiver reduces in the loop that moves the bytes",
                 "memory_tiers": f"{src}: the cut of the measured working sets with the least error: {cuts}; a "
                                 "rate no row of a tier exercises is the tier before's",
                 "devices_per_host": "the largest world size of the bench file: this machine as one host of "
                                     "that many ranks",
                 "fit_rel_err_median": f["err"], "fit_outliers": f["outliers"]})
    from commlib.sim.fit_sched import with_scheduling
    return with_scheduling(topo, data, P, collectives)


def _nnls(A, y, iters: int = 100):
    """Non-negative least squares min |Ax - y|, x >= 0 (Lawson and Hanson's active-set method)."""
    import numpy as np
    n = A.shape[1]
    x, free = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(iters):
        w = A.T @ (y - A @ x)
        cand = ~free & (w > 1e-12 * max(1.0, float(np.abs(w).max())))
        if not cand.any():
            break
        free[np.argmax(np.where(cand, w, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(A[:, free], y, rcond=None)[0]
            if (z[free] > 0).all():
                x = z
                break
            neg = free & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            free &= x > 1e-15
            x[~free] = 0.0
    return x


def fit_machine(rows, max_levels: int = MAX_LEVELS) -> dict:
    """The best fit of the rows (module docstring): {call, alpha (s), levels: [{above_bytes (0 for
    the first), next_working_set, beta, gamma, delta (s per byte moved, reduced, copied; None where
    no row of a memory tier has that term)}], err (median relative error), outliers (rows set
    aside)}."""
    import numpy as np
    from commlib.perf import model
    co, t, ws = [], [], []
    for r in rows:
        sec = r["time_us"]["median"] * 1e-6
        if sec <= 0:
            continue
        args = (r["collective"], r["algorithm"], r["bytes"], r["world_size"])
        co.append((1.0,) + tuple(model.coefficients(*args)) + (copy_coefficient(*args),))
        t.append(sec)
        ws.append(working_set_bytes(r["collective"], r["algorithm"], r["bytes"], r.get("dtype", "float32"),
                                    r["world_size"], r.get("root", 0)))
    co, t, ws = np.array(co), np.array(t), np.array(ws)
    sizes = sorted(set(int(w) for w in ws))

    def solve(cuts):
        # columns: call, alpha, then (beta, gamma, delta) per level; a row sits in one level
        level = np.searchsorted(np.array(cuts, dtype=float), ws, side="left")  # ws <= cuts[0]: level 0
        per_level = [co[:, 2:5] * (level == k)[:, None] for k in range(len(cuts) + 1)]
        A = np.column_stack([co[:, :2], *per_level])
        scale = np.where(np.abs(A).max(axis=0) > 0, np.abs(A).max(axis=0), 1.0)
        B = A / scale / t[:, None]
        kept = np.ones_like(t, dtype=bool)
        for _ in range(REFITS):
            x = _nnls(B[kept], np.ones(int(kept.sum())))
            rel = B @ x - 1.0
            again = np.abs(rel) <= OUTLIER_REL
            if (again == kept).all() or again.sum() < B.shape[1]:
                break
            kept = again
        cost = float(np.sum(np.minimum(rel ** 2, OUTLIER_REL ** 2)))
        return {"x": x / scale, "cost": cost, "err": float(np.median(np.abs(rel))), "cuts": cuts,
                "seen": A.any(axis=0), "outliers": int((~kept).sum())}

    best = solve(())
    # Cuts are added greedily (the best cut given the others, then each earlier cut moved to its
    # best place given the rest): every combination would be O(sizes^levels) fits. The k-th cut is
    # the largest working set of level k; every level keeps MIN_SIZES_PER_LEVEL sizes.
    index = {w: i for i, w in enumerate(sizes)}

    def allowed(idx):
        bounds = [-1, *sorted(idx), len(sizes) - 1]
        return len(set(idx)) == len(idx) and all(b - a >= MIN_SIZES_PER_LEVEL for a, b in zip(bounds, bounds[1:]))

    def best_with(fixed, free_slot_options):
        out = None
        for i in free_slot_options:
            idx = sorted([*fixed, i])
            if allowed(idx):
                cand = solve(tuple(sizes[j] for j in idx))
                if out is None or cand["cost"] < out["cost"]:
                    out = cand
        return out

    for _ in range(1, max_levels):
        if best["cost"] <= 1e-18 * len(t):  # exact already (rounding left): nothing for a level to explain
            break
        fixed = [index[c] for c in best["cuts"]]
        cand = best_with(fixed, range(len(sizes)))
        if cand is None or cand["cost"] > best["cost"] * (1 - LEVEL_GAIN):
            break
        for k in range(len(cand["cuts"])):  # move each cut to its best place given the others
            others = [index[c] for j, c in enumerate(cand["cuts"]) if j != k]
            moved = best_with(others, range(len(sizes)))
            if moved is not None and moved["cost"] < cand["cost"]:
                cand = moved
        best = cand
    x, cuts = best["x"], best["cuts"]
    levels = []
    for k in range(len(cuts) + 1):
        rates = [x[2 + 3 * k + i] if (k == 0 or best["seen"][2 + 3 * k + i]) else None for i in range(3)]
        levels.append({"above_bytes": cuts[k - 1] if k else 0,
                       "next_working_set": sizes[sizes.index(cuts[k - 1]) + 1] if k else None,
                       "beta": rates[0], "gamma": rates[1], "delta": rates[2]})
    return {"call": x[0], "alpha": x[1], "levels": levels, "err": best["err"], "outliers": best["outliers"]}
