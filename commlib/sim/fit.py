"""``fitted:<bench.json>``: this machine as one host, fitted to the commlib rows of a
``commlib bench --json`` run.

Every row's time is modelled as a fixed cost per call plus alpha-beta-gamma, each row's (a, b, c)
coming from its own schedule (``commlib.bench.model.coefficients``)::

    T = call + a*alpha + b*beta + c*gamma

with a memory hierarchy: a rank whose working set (its input, output and scratch buffers) is at most
``cache_bytes`` moves and reduces at the in-cache rates (beta, gamma), a larger one at the memory
rates (beta_mem, gamma_mem). The threshold is chosen among the working sets the bench measured:
for every split of the sizes into a lower (in-cache) and an upper tier, with at least
``MIN_SIZES_PER_TIER`` distinct working sets on each side, a non-negative least squares of the
relative error is solved; the split with the smallest error wins, and one tier (no threshold) is
kept unless a split does better. ``cache_bytes`` is the largest working set of the lower tier: the
real cliff lies between it and the smallest working set of the upper tier (recorded in
``sources``), so a finer bench (``-f 2``) places it more precisely.
"""
from __future__ import annotations

import functools
import json
import math
import os

from commlib.sim.topology import Topology, TopologyError

__all__ = ["from_bench", "working_set_bytes", "MIN_SIZES_PER_TIER"]

MIN_SIZES_PER_TIER = 2  # distinct working sets each tier needs for its bandwidth to be fitted
# A row the fit misses by more than this (relative) belongs to a regime the model does not describe
# (a call that left the fast path, a burst of load): it is set aside and the fit redone, up to
# REFITS times, so that it does not pull the rates; in choosing the split it counts as this error.
OUTLIER_REL = 0.5
REFITS = 4


@functools.lru_cache(maxsize=65536)
def working_set_bytes(collective: str, algorithm: str, size: int, dtype: str, ranks: int, root: int = 0) -> int:
    """The largest working set of any rank for one bench row: its input, output (out of place) and
    the schedule's scratch buffer, in bytes; the very number the simulator compares with
    ``cache_bytes`` (csrc/sim/simulator.cc)."""
    from commlib import _C
    from commlib.bench import common as C
    from commlib.bench import model
    _, block, _ = C.geometry(collective, size, dtype, ranks)
    topo = model._uniform(ranks, 0.0, model._HUGE_BPS, 0.0)
    return int(_C.simulate(collective, algorithm, block, C.elem_size(dtype), max(root, 0), topo)["max_working_set_bytes"])


@functools.lru_cache(maxsize=65536)
def copy_coefficient(collective: str, algorithm: str, n: int, P: int) -> float:
    """Bytes one rank copies locally on the critical path (the schedule's copy ops), the term
    ``commlib.bench.model.coefficients`` leaves out: T gains d / copy rate."""
    from commlib import _C
    from commlib.bench import model
    if P <= 1:
        return 0.0
    blocked = collective in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
    topo = model._uniform(P, 0.0, model._HUGE_BPS, 0.0)
    topo["copy_s_per_byte"] = 1.0
    d = _C.simulate(collective, algorithm, n // P if blocked else n, 1, 0, topo)["time_s"]
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
    return [r for r in rows if r["world_size"] == P], P


def from_bench(path: str, world_size: int | None = None, collectives=None, tiers: bool = True) -> Topology:
    """This machine as one host, fitted to the commlib rows of a bench JSON file (module docstring).

    alpha becomes the per-message latency, 1/beta the per-rank port bandwidth, 1/gamma the
    reduction rate, and with ``tiers`` the memory tier (``cache_bytes``, ``mem_intra_GBps``,
    ``mem_reduce_GBps``). The fit is the one of ``world_size`` ranks (default: the largest in the
    file), over the rows of ``collectives`` (default: all). Reductions are not pipelined
    (``chunk_bytes`` 0): on shared memory the receiving rank reduces straight out of the slot or
    the sender's buffer, in the same loop that moves the bytes, so there is nothing to overlap."""
    rows, P = _read_rows(path, world_size, collectives)
    f = fit_machine(rows, tiers=tiers)
    src = (f"fitted from {os.path.basename(path)} (commlib, {rows[0].get('transport', '?')}, {P} ranks, "
           f"{len(rows)} rows)")
    rate = lambda s_per_byte: (1.0 / s_per_byte / 1e9) if s_per_byte > 0 else math.inf  # noqa: E731
    port = lambda s_per_byte: rate(s_per_byte) if s_per_byte > 0 else 1e6  # a port must be finite  # noqa: E731
    fields = dict(
        name=f"fitted:{os.path.basename(path)}", devices_per_host=max(P, 1),
        intra_latency_us=f["alpha"] * 1e6, call_overhead_us=f["call"] * 1e6, intra_GBps=port(f["beta"]),
        reduce_GBps=rate(f["gamma"]), copy_GBps=rate(f["delta"]), chunk_bytes=0)
    sources = {"intra_latency_us": src + ": alpha", "intra_GBps": src + ": 1/beta",
               "reduce_GBps": src + ": 1/gamma", "copy_GBps": src + ": 1/delta (local copies of the schedules)",
               "call_overhead_us": src + ": fixed cost per call",
               "chunk_bytes": "0: a shared-memory receiver reduces in the loop that moves the bytes",
               "fit_rel_err_median": f["err"]}
    if f["cache_bytes"]:
        fields.update(cache_bytes=f["cache_bytes"],
                      mem_intra_GBps=None if f["beta_mem"] is None else port(f["beta_mem"]),
                      mem_reduce_GBps=None if f["gamma_mem"] is None else rate(f["gamma_mem"]),
                      mem_copy_GBps=None if f["delta_mem"] is None else rate(f["delta_mem"]))
        sources["cache_bytes"] = (f"{src}: the split of the measured working sets with the least error; the cliff "
                                  f"lies between {f['cache_bytes']} and {f['next_working_set']} bytes per rank")
        for key, term in (("mem_intra_GBps", "beta_mem"), ("mem_reduce_GBps", "gamma_mem"),
                          ("mem_copy_GBps", "delta_mem")):
            sources[key] = src + (f": 1/{term[:-4]} of the rows beyond cache_bytes" if f[term] is not None
                                  else ": no row beyond cache_bytes has this term; the in-cache rate")
    else:
        sources["cache_bytes"] = src + ": one tier fitted best (no cliff among the measured sizes)"
    return Topology(**fields, sources=sources)


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


def fit_machine(rows, tiers: bool = True) -> dict:
    """The best fit of the rows (module docstring): {call, alpha (s), beta, gamma, delta (s per byte
    moved, reduced, copied in cache), beta_mem, gamma_mem, delta_mem (beyond it; None where no row
    beyond the cache has that term), cache_bytes (0 when one tier fits best), next_working_set,
    err (median relative error), outliers (rows set aside)}."""
    import numpy as np
    from commlib.bench import model
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

    def solve(inside):
        # columns: call, alpha, then beta, gamma, delta in cache, then beta, gamma, delta beyond
        per_byte = co[:, 2:5]
        A = np.column_stack([co[:, :2], per_byte * inside[:, None], per_byte * ~inside[:, None]])
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
        return x / scale, cost, float(np.median(np.abs(rel))), A[:, 5:].any(axis=0), int((~kept).sum())

    one = np.ones_like(t, dtype=bool)
    best = solve(one) + (0,)
    sizes = sorted(set(int(w) for w in ws))
    if tiers:
        for k in range(MIN_SIZES_PER_TIER - 1, len(sizes) - MIN_SIZES_PER_TIER):
            cand = solve(ws <= sizes[k]) + (k + 1,)
            if cand[1] < best[1] * (1 - 1e-9):  # strictly better than what we have (one tier first)
                best = cand
    x, _, err, seen_beyond, outliers, split = best
    out = {"call": x[0], "alpha": x[1], "beta": x[2], "gamma": x[3], "delta": x[4], "err": err,
           "outliers": outliers, "cache_bytes": 0, "next_working_set": None,
           "beta_mem": x[2], "gamma_mem": x[3], "delta_mem": x[4]}
    if split:
        out.update(cache_bytes=sizes[split - 1], next_working_set=sizes[split],
                   **{k: (x[5 + i] if seen_beyond[i] else None)
                      for i, k in enumerate(("beta_mem", "gamma_mem", "delta_mem"))})
    return out
