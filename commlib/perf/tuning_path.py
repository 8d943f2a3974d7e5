"""Smoothing measured or predicted times into a tuning table's rows, shared by the bench
(commlib/bench/tuning.py, from measurements) and the simulator (commlib/sim/tune.py, from
predictions), so neither imports the other. The table's format is commlib.core.tuning's."""
from __future__ import annotations

import math

TOLERANCE = 0.10  # a pick is at most 10% slower than the best measured at its size
SWITCH_COST = 0.05  # ... and changes algorithm only when that gains more than 5% somewhere


def choose_path(times):
    """times[i]: {algorithm: seconds} at the i-th size. Pick one algorithm per size, each within
    TOLERANCE of that size's best, minimising (relative excess over the best) + SWITCH_COST per
    change of algorithm between neighbouring sizes (dynamic programming). Measurements are noisy:
    among near-equal algorithms this keeps one, instead of following the noise."""
    algs = sorted({a for t in times for a in t})
    INF = float("inf")

    def excess(i, a):
        t = times[i]
        if a not in t:
            return INF
        best = min(t.values())
        x = t[a] / best - 1.0 if best > 0 else 0.0
        return x if x <= TOLERANCE else INF

    cost = {a: excess(0, a) for a in algs}
    back = []
    for i in range(1, len(times)):
        new, ptr = {}, {}
        for a in algs:
            e = excess(i, a)
            prev = min(algs, key=lambda b: cost[b] + (SWITCH_COST if b != a else 0.0))
            new[a] = e + cost[prev] + (SWITCH_COST if prev != a else 0.0)
            ptr[a] = prev
        cost = new
        back.append(ptr)
    a = min(algs, key=lambda b: cost[b])
    path = [a]
    for ptr in reversed(back):
        a = ptr[a]
        path.append(a)
    return path[::-1]


def rows(core_sizes, picks):
    """The table's rows [[up_to_core_bytes, algorithm], ..., [-1, algorithm]] from one pick per
    size: a row ends halfway (geometrically) between two sizes whose picks differ."""
    out = []
    for i, alg in enumerate(picks):
        if i + 1 < len(picks) and picks[i + 1] == alg:
            continue
        if i + 1 < len(picks):
            out.append([int(math.sqrt(core_sizes[i] * core_sizes[i + 1])), alg])
        else:
            out.append([-1, alg])
    return out
