"""Slow spells in runs of ``commlib bench`` (issue #42): where a pass ran slow as a whole, as
opposed to one series losing.

    python bench/spells.py run1.json run2.json ... [--ranks 4] [--threshold 1.4] [--levels FILE]

Every row of a run of several passes keeps each pass's median (``pass_medians_us``). For each
(collective, size) and pass, every series (an algorithm and mode of commlib, or a peer) gets the
ratio of that pass's median to the series' best pass over all the runs given; the size's *spell
ratio* is the median of those ratios over its commlib series. A spell is a stretch of sizes of one
collective in one pass whose spell ratio is at least ``--threshold``: the machine was slow then
(bench/RESULTS_collectives.md session 24: every commlib series of a size slows alike, most at
128 KiB), and a ratio against a peer measured at another time says nothing there. For each such
size the peer's ratio in the same pass is shown: with MPI in commlib's rank processes
(``--peer-jobs same``) it was measured in the same rounds, so a spell should show on it too. With
``--levels`` (bench/core_handoff.py's output, run beside the bench) each stretch says how many probe
windows during it saw the cores' slow level: whether that level is what a spell is.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # core_handoff (--levels)

from commlib.perf.common import fmt_bytes  # noqa: E402


def series_key(r):
    return (r["backend"], r["collective"], r["algorithm"], r["mode"], r["bytes"])


def spell_ratios(runs, P=None):
    """[(run index, pass index, collective, bytes, commlib spell ratio, {peer: its ratio}, (began,
    ended) wall clock or None)] for every size and pass of every run (runs: the dicts ``commlib bench
    --json`` writes; the wall clock from the rows' ``pass_at``, recorded since session 24)."""
    best = {}
    for d in runs:
        for r in d["results"]:
            if P is not None and r["world_size"] != P or not r.get("pass_medians_us"):
                continue
            k = series_key(r)
            best[k] = min([best.get(k, float("inf"))] + list(r["pass_medians_us"]))
    out = []
    for i, d in enumerate(runs):
        by_size = {}
        for r in d["results"]:
            if P is not None and r["world_size"] != P or not r.get("pass_medians_us"):
                continue
            if r["backend"] == "commlib" and r["algorithm"] == "auto":
                continue  # auto repeats one of the algorithms
            by_size.setdefault((r["collective"], r["bytes"]), []).append(r)
        passes = max((len(r["pass_medians_us"]) for rs in by_size.values() for r in rs), default=0)
        for p in range(passes):
            for (coll, nbytes), rs in by_size.items():
                ratios = {}
                for r in rs:
                    if p < len(r["pass_medians_us"]) and best[series_key(r)] > 0:
                        ratios.setdefault(r["backend"], []).append(r["pass_medians_us"][p] / best[series_key(r)])
                if "commlib" not in ratios:
                    continue
                peers = {b: statistics.median(v) for b, v in ratios.items() if b != "commlib"}
                when = [r["pass_at"][p] for r in rs if p < len(r.get("pass_at") or []) and r["pass_at"][p]]
                span = (min(w[0] for w in when), max(w[1] for w in when)) if when else None
                out.append((i, p, coll, nbytes, statistics.median(ratios["commlib"]), peers, span))
    return out


def spells(runs, P=None, threshold=1.4, min_sizes=1):
    """The stretches: [(run index, pass index, collective, [(bytes, commlib ratio, {peer: ratio},
    span)])], at least ``min_sizes`` consecutive sizes of one collective in one pass at or above
    ``threshold``."""
    out = []
    cur = None
    for i, p, coll, nbytes, ratio, peers, span in spell_ratios(runs, P):
        if ratio >= threshold:
            if cur is not None and tuple(cur[:3]) == (i, p, coll):
                cur[3].append((nbytes, ratio, peers, span))
            else:
                cur = [i, p, coll, [(nbytes, ratio, peers, span)]]
                out.append(cur)
        else:
            cur = None
    return [tuple(s) for s in out if len(s[3]) >= min_sizes]


SLOW_ROUND_TRIP_NS = 200.0  # between core_handoff.py's two levels (80-100 and 320-460 ns)


def levels_during(levels, span):
    """(slow windows, windows) of core_handoff.py's lines within ``span`` (began, ended)."""
    if span is None:
        return 0, 0
    seen = [rt for t, rt, _ in levels if span[0] <= t <= span[1] and rt > 0]
    return sum(rt >= SLOW_ROUND_TRIP_NS for rt in seen), len(seen)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--ranks", type=int, default=None)
    ap.add_argument("--threshold", type=float, default=1.4)
    ap.add_argument("--min-sizes", type=int, default=3, help="consecutive sizes that make a stretch (default 3)")
    ap.add_argument("--levels", metavar="FILE", help="bench/core_handoff.py's output during the runs: each "
                                                      "stretch then says how many of its probe windows saw the slow level")
    a = ap.parse_args(argv)
    runs = [json.load(open(f)) for f in a.runs]
    found = spells(runs, a.ranks, a.threshold, a.min_sizes)
    levels = None
    if a.levels:
        from core_handoff import read_levels
        levels = read_levels(a.levels)
    print("| run | pass | collective | sizes: commlib's spell ratio (peers' in the same pass) |"
          + (" probe windows at the slow level |" if levels is not None else ""))
    print("|---|---|---|---|" + ("---|" if levels is not None else ""))
    for i, p, coll, sizes in found:
        cells = ", ".join(f"{fmt_bytes(b)} {r:.1f}x" + (" (" + ", ".join(f"{k} {v:.1f}x" for k, v in sorted(peers.items()))
                                                        + ")" if peers else "") for b, r, peers, _ in sizes)
        line = f"| {a.runs[i]} | {p + 1} | {coll} | {cells} |"
        if levels is not None:
            spans = [sp for _, _, _, sp in sizes if sp]
            slow, n = levels_during(levels, (spans[0][0], spans[-1][1]) if spans else None)
            line += f" {slow} of {n} |"
        print(line)
    if not found:
        print(f"no stretch at or above {a.threshold}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
