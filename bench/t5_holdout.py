"""How far issue 42's T5 (auto within 10% of the best measured algorithm) is a choice and how far
noise, from several runs of the main job (``scripts/bench.sh``'s report/bench.json, one world size):

    python bench/t5_holdout.py run1.json run2.json ... [--ranks 4] [--table commlib/core/tuning.json]
                               [--pass-statistic min|median|max] [--n 1,5] [--max-subsets 20]

Prints, per held-out run, the misses of
- ``auto``: auto's own row (T5 as bench/targets.py counts it);
- ``table``: the algorithm ``--table`` picks, by that algorithm's own row in the run (T5');
- ``tuned from n``: a table tuned (``commlib tune``'s rules) from n of the *other* runs, averaged
  over every choice of them (leave-out: the run judged never tuned the table);
- ``ceiling``: per point the one algorithm that misses in the fewest of all the runs, the judged
  one included (no table does better on these runs; with noise, it still misses);
and how often auto's own row and its algorithm's own row, two measurements of one algorithm in one
run, differ by more than 10% (the noise of a single row). A miss: > 10% over the run's best, and
not the best algorithm itself (T5's rule). Auto's flag calls (small broadcasts) count as picked.

Every choice of n other runs is a table tuned (seconds each on the main job's runs): over twelve runs
that is 2^11 tables per judged run. ``--n`` (a comma list) limits the columns to those n, ``--max-subsets``
to that many choices per n and judged run, drawn alike on every call (seeded); ``--n 11`` over twelve
runs is leave-one-out.

``--pass-statistic`` re-merges every row from its passes' medians (``pass_medians_us``) with that
statistic before judging (the runs' own: ``commlib bench --pass-statistic``, default min): which
statistic leaves auto the fewest misses on the same runs.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commlib.bench import report, tuning  # noqa: E402
from commlib.core import tuning as core_tuning  # noqa: E402
from commlib.perf.common import core_bytes  # noqa: E402


PASS_STATISTICS = {"min": min, "median": lambda xs: float(sorted(xs)[len(xs) // 2]) if len(xs) % 2 else
                   (sorted(xs)[len(xs) // 2 - 1] + sorted(xs)[len(xs) // 2]) / 2, "max": max}


def remerged(data, statistic):
    """``data`` with every row's median time replaced by ``statistic`` (a PASS_STATISTICS name) of its
    passes' medians; rows of one pass (no ``pass_medians_us``) as they are."""
    f = PASS_STATISTICS[statistic]
    out = []
    for r in data["results"]:
        pm = r.get("pass_medians_us")
        out.append(dict(r, time_us=dict(r["time_us"], median=f(pm))) if pm else r)
    return dict(data, results=out)


def points(data, P):
    """{(collective, bytes): comparison row} of one run at ``P`` ranks."""
    return {(r["collective"], r["bytes"]): r for r in report.comparison(data["results"]) if r["world_size"] == P}


def missed(algorithm, row):
    t = row["times"].get(algorithm)
    return t is None or (t > 1.10 * row["best_us"] and algorithm != row["best"])


def table_misses(table, rows, P):
    """Misses of ``table``'s picks in one run: auto's flag calls stay flag calls up to the table's
    flags cutoff for the collective and world size (its "flags" section), and take its row above."""
    cutoffs = core_tuning.flag_cutoffs(table or {})
    n = 0
    for (coll, nbytes), r in rows.items():
        cb = core_bytes(coll, nbytes, "float32", r["world_size"])
        flags = r["auto_resolved"] == "flags" and cb <= cutoffs.get(coll, {}).get(P, cb)
        pick = "flags" if flags else core_tuning.choose(table, coll, cb, P)
        n += missed(pick, r)
    return n


def ceiling(runs):
    """Per run, the misses of the best fixed algorithm per point, chosen knowing every run."""
    keys = set.intersection(*[set(r) for r in runs])
    out = [0] * len(runs)
    for k in keys:
        rs = [r[k] for r in runs]
        algs = set.intersection(*[set(r["times"]) for r in rs])
        a = min(algs, key=lambda x: (sum(missed(x, r) for r in rs),
                                     sum(math.log(r["times"][x] / r["best_us"]) for r in rs)))
        for i, r in enumerate(rs):
            out[i] += missed(a, r)
    return out


def row_noise(rows):
    """Points where auto's row and its algorithm's row differ by more than 10%."""
    return sum(1 for r in rows.values() if r["auto_us"] and r["times"].get(r["auto_resolved"]) and
               abs(math.log(r["auto_us"] / r["times"][r["auto_resolved"]])) > math.log(1.10))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--table", default=core_tuning.default_path())
    p.add_argument("--pass-statistic", choices=sorted(PASS_STATISTICS),
                   help="re-merge each row from its passes' medians with this statistic first")
    p.add_argument("--n", help="comma list of the numbers of runs to tune from (default every one)")
    p.add_argument("--max-subsets", type=int, help="at most this many choices of the runs per n and judged run")
    a = p.parse_args(argv)
    datas = [json.load(open(x)) for x in a.runs]
    if a.pass_statistic:
        datas = [remerged(d, a.pass_statistic) for d in datas]
    rows = [points(d, a.ranks) for d in datas]
    table = core_tuning.read(a.table)
    if table is not None:  # the table as it applies on the runs' machine class (its "machines" section)
        table = core_tuning.for_machine(table, (json.load(open(a.runs[0])).get("machine") or None))
    ns = list(range(1, len(datas)))
    if a.n:
        ns = sorted({int(x) for x in a.n.split(",") if x})
        if not ns or ns[0] < 1 or ns[-1] >= len(datas):
            raise SystemExit(f"t5_holdout: --n {a.n}: each must be 1..{len(datas) - 1} (the other runs)")
    if a.max_subsets is not None and a.max_subsets < 1:
        raise SystemExit(f"t5_holdout: --max-subsets {a.max_subsets}: must be 1 or more")
    tuned = {}  # (n, held-out run) -> mean misses over the tables tuned from n other runs
    for n in ns:
        for h in range(len(datas)):
            subs = list(itertools.combinations([j for j in range(len(datas)) if j != h], n))
            if a.max_subsets is not None and len(subs) > a.max_subsets:
                subs = random.Random(f"{n}/{h}").sample(subs, a.max_subsets)
            ms = [table_misses(tuning.from_runs([datas[j] for j in sub], previous=copy.deepcopy(table)), rows[h], a.ranks)
                  for sub in subs]
            tuned[n, h] = sum(ms) / len(ms)
    top = ceiling(rows)
    head = ["run", "points", "auto", "table"] + [f"tuned from {n}" for n in ns] + ["ceiling", "row noise"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for h, path in enumerate(a.runs):
        auto = sum(1 for r in rows[h].values() if r["auto_us"] and r["auto_us"] > 1.10 * r["best_us"]
                   and r["auto_resolved"] != r["best"])
        cells = [os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path), len(rows[h]), auto,
                 table_misses(table, rows[h], a.ranks)] + [f"{tuned[n, h]:.1f}" for n in ns] + \
                [top[h], row_noise(rows[h])]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    means = [sum(tuned[n, h] for h in range(len(datas))) / len(datas) for n in ns]
    print("\nmean held-out misses of a table tuned from n runs: " +
          ", ".join(f"n={n}: {m:.2f}" for n, m in zip(ns, means)) +
          f"; ceiling {sum(top) / len(top):.2f} (at most 3 in {sum(t <= 3 for t in top)} of {len(top)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
