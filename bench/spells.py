"""Slow spells in runs of ``commlib bench`` (issue #42): where a pass ran slow as a whole, as
opposed to one series losing.

    python bench/spells.py run1.json run2.json ... [--ranks 4] [--threshold 1.4]

Every row of a run of several passes keeps each pass's median (``pass_medians_us``). For each
(collective, size) and pass, every series (an algorithm and mode of commlib, or a peer) gets the
ratio of that pass's median to the series' best pass over all the runs given; the size's *spell
ratio* is the median of those ratios over its commlib series. A spell is a stretch of sizes of one
collective in one pass whose spell ratio is at least ``--threshold``: the machine was slow then
(bench/RESULTS_collectives.md session 24: every commlib series of a size slows alike, most at
128 KiB), and a ratio against a peer measured at another time says nothing there. For each such
size the peer's ratio in the same pass is shown: with MPI in commlib's rank processes
(``--peer-jobs same``) it was measured in the same rounds, so a spell should show on it too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commlib.perf.common import fmt_bytes  # noqa: E402


def series_key(r):
    return (r["backend"], r["collective"], r["algorithm"], r["mode"], r["bytes"])


def spell_ratios(runs, P=None):
    """[(run index, pass index, collective, bytes, commlib spell ratio, {peer: its ratio})] for every
    size and pass of every run (runs: the dicts ``commlib bench --json`` writes)."""
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
                out.append((i, p, coll, nbytes, statistics.median(ratios["commlib"]), peers))
    return out


def spells(runs, P=None, threshold=1.4, min_sizes=1):
    """The stretches: [(run index, pass index, collective, [(bytes, commlib ratio, {peer: ratio})])],
    at least ``min_sizes`` consecutive sizes of one collective in one pass at or above ``threshold``."""
    out = []
    cur = None
    for i, p, coll, nbytes, ratio, peers in spell_ratios(runs, P):
        if ratio >= threshold:
            if cur is not None and tuple(cur[:3]) == (i, p, coll):
                cur[3].append((nbytes, ratio, peers))
            else:
                cur = [i, p, coll, [(nbytes, ratio, peers)]]
                out.append(cur)
        else:
            cur = None
    return [tuple(s) for s in out if len(s[3]) >= min_sizes]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--ranks", type=int, default=None)
    ap.add_argument("--threshold", type=float, default=1.4)
    ap.add_argument("--min-sizes", type=int, default=3, help="consecutive sizes that make a stretch (default 3)")
    a = ap.parse_args(argv)
    runs = [json.load(open(f)) for f in a.runs]
    found = spells(runs, a.ranks, a.threshold, a.min_sizes)
    print("| run | pass | collective | sizes: commlib's spell ratio (peers' in the same pass) |")
    print("|---|---|---|---|")
    for i, p, coll, sizes in found:
        cells = ", ".join(f"{fmt_bytes(b)} {r:.1f}x" + (" (" + ", ".join(f"{k} {v:.1f}x" for k, v in sorted(peers.items()))
                                                        + ")" if peers else "") for b, r, peers in sizes)
        print(f"| {a.runs[i]} | {p + 1} | {coll} | {cells} |")
    if not found:
        print(f"no stretch at or above {a.threshold}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
