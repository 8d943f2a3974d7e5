"""Which series of one size get more rounds (``commlib bench --close-rounds``): those whose medians
decide a verdict of the report that a row's noise could turn.

A row's median over 20-40 calls moves by 10% or more between runs (issue 42's quiet runs: auto's row
and its own algorithm's row, two measurements of one algorithm in one run, differ by more than 10% at
4-7 of 60 points a run). So after a size's regular rounds the sweep asks, from the medians so far in
the comparison mode, whether moving any one series by ``margin`` (10%) either way would turn
- **T5**: auto more than 10% over the best algorithm, auto not running the best (bench/targets.py), or
- **the peer's verdict**: Open MPI's median over auto's at or above 1.0x,
and if so times the series that decide it (auto, the algorithm auto runs, every series whose move
turns it, the peer) in that many more interleaved rounds. Every series of a close decision gets the
same rounds at the same times, so their ratio keeps the interleaving's protection; the row's time
stays the median over all its calls, and the record says how many rounds it had. A decision far from
its threshold costs nothing more.
"""
from __future__ import annotations

MARGIN = 0.10
T5_TOLERANCE = 1.10


def _t5_miss(medians, algs, auto_alg):
    # candidates as bench/targets.py's T5 sees them: the algorithms, and auto's own path (broadcast's
    # flag calls, which no named algorithm takes) under its name, timed by auto's row
    cands = {a: medians[a] for a in algs}
    if auto_alg not in cands:
        cands[auto_alg] = medians["auto"]
    best = min(cands, key=cands.get)
    return medians["auto"] > T5_TOLERANCE * cands[best] and auto_alg != best


def close_series(medians: dict, auto_alg, peer=None, margin: float = MARGIN) -> set:
    """The series (keys of ``medians``: commlib's algorithms, "auto", and ``peer``'s name) whose
    decisions are within ``margin`` of turning; empty when none is.

    ``auto_alg``: what auto runs at this size, an algorithm measured beside it or a path of its own
    (broadcast's flag calls: then a candidate timed by auto's row, as the report counts it); T5 is
    not asked when auto was not measured."""
    out = set()
    algs = [a for a in medians if a not in ("auto", peer)]
    if "auto" in medians and auto_alg and algs:
        base = _t5_miss(medians, algs, auto_alg)
        for s in algs + ["auto"]:
            for f in (1.0 + margin, 1.0 / (1.0 + margin)):
                moved = dict(medians, **{s: medians[s] * f})
                if _t5_miss(moved, algs, auto_alg) != base:
                    out.add(s)
        if out:
            out |= {"auto", auto_alg}
    if peer in medians and "auto" in medians and medians["auto"] > 0:
        ratio = medians[peer] / medians["auto"]
        if 1.0 / (1.0 + margin) <= ratio < 1.0 + margin:  # one margin's move of either turns "at or above 1.0x"
            out |= {peer, "auto"}
    return out
