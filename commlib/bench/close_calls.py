"""Which series of one size get more rounds (``commlib bench --close-rounds``): those whose medians
decide a verdict of the report that a row's noise could turn.

A row's median over 20-40 calls moves by 10% or more between runs (issue 42's quiet runs: auto's row
and its own algorithm's row, two measurements of one algorithm in one run, differ by more than 10% at
4-7 of 60 points a run). So after a size's regular rounds the sweep asks, from the medians so far in
the comparison mode, whether moving any one series by ``margin`` (10%) either way would turn
- **T5**: auto more than 10% over the best algorithm, auto not running the best (bench/targets.py), or
- **the peer's verdicts**: Open MPI's median over auto's at or above 1.0x, and over commlib's best
  row's (the summary's ``mpi/cl`` column and bench/targets.py's T3/T4: the fastest named algorithm,
  or auto's own path where no named algorithm takes it),
and if so times the series that decide it (auto, the algorithm auto runs, every series whose move
turns it, the peer) in that many more interleaved rounds. Where auto runs the best algorithm, that
algorithm's own row is a second measurement of it, and the one the summary divides by: before
session 42 only auto's row got the rounds, and a 20-call row of the algorithm (all_to_all 8 MiB,
direct 1505 us against auto's 1416 running it) put the summary under Open MPI (1487 us). Every
series of a close decision gets the same rounds at the same times, so their ratio keeps the
interleaving's protection; the row's time stays the median over all its calls, and the record says
how many rounds it had. A decision far from its threshold costs nothing more.
"""
from __future__ import annotations

MARGIN = 0.10
T5_TOLERANCE = 1.10


def _candidates(medians, algs, auto_alg):
    # commlib's candidates as bench/targets.py and the summary (comparison.py) see them: the
    # algorithms, and auto's own path (broadcast's flag calls, which no named algorithm takes) under
    # its name, timed by auto's row
    cands = {a: medians[a] for a in algs}
    if auto_alg and auto_alg not in cands and "auto" in medians:
        cands[auto_alg] = medians["auto"]
    return cands


def _t5_miss(medians, algs, auto_alg):
    cands = _candidates(medians, algs, auto_alg)
    best = min(cands, key=cands.get)
    return medians["auto"] > T5_TOLERANCE * cands[best] and auto_alg != best


def _best_under_peer(medians, algs, auto_alg, peer):
    # the summary's verdict: commlib's best row slower than the peer's
    return min(_candidates(medians, algs, auto_alg).values()) > medians[peer]


def _turned_by(verdict, medians, series, margin):
    """The series of ``series`` whose move by ``margin`` either way turns ``verdict(medians)``."""
    base = verdict(medians)
    return {s for s in series for f in (1.0 + margin, 1.0 / (1.0 + margin))
            if verdict(dict(medians, **{s: medians[s] * f})) != base}


def close_series(medians: dict, auto_alg, peer=None, margin: float = MARGIN) -> set:
    """The series (keys of ``medians``: commlib's algorithms, "auto", and ``peer``'s name) whose
    decisions are within ``margin`` of turning; empty when none is.

    ``auto_alg``: what auto runs at this size, an algorithm measured beside it or a path of its own
    (broadcast's flag calls: then a candidate timed by auto's row, as the report counts it); T5 is
    not asked when auto was not measured."""
    out = set()
    algs = [a for a in medians if a not in ("auto", peer)]
    if "auto" in medians and auto_alg and algs:
        out |= _turned_by(lambda m: _t5_miss(m, algs, auto_alg), medians, algs + ["auto"], margin)
        if out:
            out |= {"auto", auto_alg}
    if peer in medians and "auto" in medians and medians["auto"] > 0:
        ratio = medians[peer] / medians["auto"]
        if 1.0 / (1.0 + margin) <= ratio < 1.0 + margin:  # one margin's move of either turns "at or above 1.0x"
            out |= {peer, "auto"}
    if peer in medians and algs:
        moving = algs + ([peer, "auto"] if "auto" in medians else [peer])
        turned = _turned_by(lambda m: _best_under_peer(m, algs, auto_alg, peer), medians, moving, margin)
        if turned:
            out |= turned | {peer}
    return out
