"""One simulator parameter fitted to measured bench rows: a parameter the prediction never falls in.

The simulator's latency-like parameters (``inter_latency_us``, ``sched_quantum_us``, ``wake_us``)
add a fixed amount per message, step or wake-up, so a row's predicted time never falls as the
value grows (it is piecewise linear: the slope grows as more of the critical path pays the term,
which is why one slope from two simulations is not enough). Each row's estimate is the value at
which its prediction meets its measurement (bisection), and the fit is the median of the
estimates: robust to the few rows a loaded machine throws far off, where a least-squares fit
would follow them.
"""
from __future__ import annotations

import statistics

__all__ = ["fit_monotone", "with_scheduling", "SPIN_US", "TCP_SPIN_US", "QUANTUM_FIT_BYTES"]

UPPER = 1e6        # the largest value searched (us for the latency-like parameters: one second)
BISECTIONS = 60    # UPPER / 2**60: far below any measurement's resolution
SPIN_US = 20.0     # COMMLIB_SPIN_US's default (csrc/common/params.cc): a wait on this host spins this long
TCP_SPIN_US = 1000.0  # COMMLIB_TCP_SPIN_US's default: a wait on other hosts polls this long, yielding between polls
QUANTUM_FIT_BYTES = 4096  # rows up to this size are latency-bound: they fit sched_quantum_us


def _predict(row, topo) -> float:
    from commlib import sim
    return sim.predict(row["collective"], row["algorithm"], row["bytes"], row["world_size"], topo,
                       row.get("dtype", "float32"), max(row.get("root", 0) or 0, 0))["time_us"]["median"]


def _solve(row, topology_with) -> float | None:
    """The value at which the row's prediction meets its measurement; None if it does not depend."""
    want = row["time_us"]["median"]
    lo, hi = 0.0, UPPER
    base, top = _predict(row, topology_with(lo)), _predict(row, topology_with(hi))
    if top - base <= 1e-9 * max(1.0, base):
        return None
    if want <= base:
        return 0.0
    if want >= top:
        return UPPER
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if _predict(row, topology_with(mid)) < want:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_monotone(rows, topology_with, max_bytes: int | None = None) -> float:
    """The value of one parameter that best explains ``rows`` (bench records with ``time_us.median``).

    ``topology_with(v)`` returns the topology with the parameter set to ``v`` (in the parameter's
    unit, searched in [0, UPPER]). Only rows up to ``max_bytes`` (None: all) whose prediction
    depends on the parameter are used; ``auto`` rows are skipped (their algorithm depends on the
    size policy). Raises ValueError if no row depends on the parameter."""
    estimates = []
    for r in rows:
        if r.get("algorithm") == "auto" or (max_bytes is not None and r["bytes"] > max_bytes):
            continue
        v = _solve(r, topology_with)
        if v is not None:
            estimates.append(v)
    if not estimates:
        raise ValueError("fit_monotone: no row's prediction depends on the parameter")
    return statistics.median(estimates)


def with_scheduling(topo, data: dict, P: int, collectives=None):
    """``topo`` (fitted at ``P`` ranks from the bench file ``data``) with the CPU-scheduling terms
    the file supports (docs/simulator.md, "Waiting"), else ``topo`` unchanged:

    - ``cores_per_host``: the file's ``machine.cores``, if the P ranks fit on them (a fit at more
      ranks than cores has the sharing inside its rates already, and is left alone);
    - ``spin_us``: COMMLIB_SPIN_US's default;
    - ``sched_quantum_us``: fitted (``fit_monotone``) on the rows up to QUANTUM_FIT_BYTES of the
      smallest world size in the file above the cores, when there is one; else 0, and ranks
      beyond the cores only share the cores' time (software costs, byte rates). The wake-up is
      inside the quantum (``wake_us`` 0): one oversubscription ratio cannot separate them."""
    import dataclasses
    cores = (data.get("machine") or {}).get("cores")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1 or P > cores:
        return topo
    topo = dataclasses.replace(topo, cores_per_host=cores, spin_us=SPIN_US, wake_us=0.0, sched_quantum_us=0.0)
    over = [r for r in data["results"] if r.get("backend") == "commlib" and r.get("algorithm") != "auto"
            and (collectives is None or r.get("collective") in collectives)
            and isinstance(r.get("world_size"), int) and r["world_size"] > cores]
    src = dict(topo.sources, cores_per_host=f"machine.cores of the bench file ({cores})",
               spin_us="COMMLIB_SPIN_US's default")
    if not over:
        src["sched_quantum_us"] = "0: the bench file has no run with more ranks than cores to fit it on"
        return dataclasses.replace(topo, sources=src)
    W = min(r["world_size"] for r in over)
    rows = [r for r in over if r["world_size"] == W]
    try:
        quantum = fit_monotone(rows, lambda v: dataclasses.replace(topo, sched_quantum_us=v), QUANTUM_FIT_BYTES)
    except ValueError:
        return dataclasses.replace(topo, sources=src)
    src["sched_quantum_us"] = (f"fitted on the {len(rows)} rows at {W} ranks ({W / cores:g} per core) up to "
                               f"{QUANTUM_FIT_BYTES} B; includes the wake-up (wake_us 0)")
    return dataclasses.replace(topo, sched_quantum_us=quantum, sources=src)
