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

__all__ = ["fit_monotone"]

UPPER = 1e6        # the largest value searched (us for the latency-like parameters: one second)
BISECTIONS = 60    # UPPER / 2**60: far below any measurement's resolution


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
