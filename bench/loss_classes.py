"""Issue 42's losses over several runs of the main job, each classed as systematic or noise
(one run's loss is never systematic: at least two runs, and at least half of them):

    python bench/loss_classes.py run1.json run2.json ... [--ranks 4] [--mpi-margin 1.05]
                                 [--apply commlib/core/tuning.json -o OUT]

A loss at a (collective, size) point in one run is either
- a **T5 miss**: auto's row more than 10% over the run's best algorithm, auto not running the best
  (bench/targets.py's T5), or
- a **row below the MPI margin**: Open MPI's median over auto's, in the same mode, under
  ``--mpi-margin`` (1.05: a row at parity is a loss waiting for the next run's noise).

Each listed point (a loss in any run) gets one class from all the runs together:
- **systematic: table** - the algorithm auto runs has its own row more than 10% over the best in
  at least half the runs, and another algorithm does so in fewer runs: a table entry to change
  (the ``fix`` column names that algorithm; ties go to the lower geometric mean over the best);
- **systematic: algorithm** - auto's row under the MPI margin in at least half the runs, and
  commlib's best row too: no table entry helps, the path itself is too slow;
- **systematic: table (MPI)** - auto's row and its algorithm's own row under the margin in at least
  half the runs, commlib's best row not: another algorithm beats MPI where auto's does not;
- **noise** - the point loses in fewer than half the runs (or in one run only), or the algorithm auto runs misses no more
  often than any fixed choice would (the ranking flips between runs: no table does better), or only
  auto's own row is under the margin (its algorithm's own row is not: one noisy row).

A ``commlib bench --single-copy-ab`` run (both sides of every algorithm, ``<algorithm>@cma0|1``) is read
as the run the table's single-copy crossover makes (``--table``, default the shipped one): at each size
each algorithm's record from the side the crossover puts that size on (``as_shipped``).

``--apply TABLE -o OUT`` writes TABLE with each "systematic: table" point's fix spliced in: the fix
from halfway (geometrically, as ``commlib tune`` places its crossovers) to the measured sizes either
side, every other row as it was. ``commlib tune`` over the same runs does not make these: it takes
each algorithm's median over both modes and runs and pays 5% a switch, where T5 judges the
comparison mode run by run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commlib.bench import report  # noqa: E402
from commlib.core import tuning as core_tuning  # noqa: E402
from commlib.perf.common import core_bytes, fmt_bytes  # noqa: E402

T5_TOLERANCE = 1.10  # T5: auto within 10% of the best


def points(data, P):
    """{(collective, bytes): comparison row} of one run at ``P`` ranks."""
    return {(r["collective"], r["bytes"]): r for r in report.comparison(data["results"]) if r["world_size"] == P}


def as_shipped(data, table, P):
    """A --single-copy-ab run as the run ``table``'s single-copy crossover makes: each record of an
    ``<algorithm>@cma<side>`` series kept, renamed ``<algorithm>``, where ``side`` is the one the
    table's ``single_copy`` section puts its (collective, per-rank bytes) on at ``P`` ranks; other
    runs returned as they are."""
    from commlib.bench import single_copy_ab
    if (data.get("config") or {}).get("single_copy") != "both":
        return data
    out = []
    for r in data["results"]:
        algo, side = single_copy_ab.parse(r.get("algorithm", ""))
        if side is None:
            out.append(r)
            continue
        entry = (table.get("single_copy") or {}).get(r["collective"], {}).get(str(r["world_size"]), {})
        least = entry.get("min_bytes", -1)
        on = least >= 0 and core_bytes(r["collective"], r["bytes"], r["dtype"], r["world_size"]) >= least
        if side == ("1" if on else "0"):
            out.append(dict(r, algorithm=algo))
    return dict(data, results=out)


def t5_miss(row):
    """auto's row more than 10% over the best, auto not running the best (T5's rule)."""
    return bool(row["auto_us"]) and row["auto_us"] > T5_TOLERANCE * row["best_us"] and row["auto_resolved"] != row["best"]


def own_miss(algorithm, row):
    """``algorithm``'s own row (not auto's) more than 10% over the best: the choice, without auto's row's noise."""
    t = row["times"].get(algorithm)
    return t is None or (t > T5_TOLERANCE * row["best_us"] and algorithm != row["best"])


def mpi_ratio(row):
    """Open MPI's median over auto's (above 1: commlib faster); None without both."""
    return row["mpi_us"] / row["auto_us"] if row.get("mpi_us") and row.get("auto_us") else None


def best_fixed(rows):
    """(algorithm, own-row misses) of the one algorithm a table could name at this point that misses
    in the fewest runs (ties: the lowest geometric mean over each run's best)."""
    algs = set.intersection(*[set(r["times"]) for r in rows])
    if not algs:
        return None, len(rows)
    key = lambda a: (sum(own_miss(a, r) for r in rows), sum(math.log(r["times"][a] / r["best_us"]) for r in rows))  # noqa: E731
    a = min(sorted(algs), key=key)
    return a, key(a)[0]


def classify(rows, mpi_margin=1.05):
    """The class of one point from its rows in every run (list of comparison rows): a dict with
    t5 (misses per run), mpi (ratio per run), cls, fix and why."""
    n = len(rows)
    half = max(2, (n + 1) // 2)  # "the same point in most runs": never one run's loss alone
    t5 = [t5_miss(r) for r in rows]
    mpi = [mpi_ratio(r) for r in rows]
    below = [m is not None and m < mpi_margin for m in mpi]
    best_below = [bool(r.get("mpi_us")) and r["mpi_us"] / r["best_us"] < mpi_margin for r in rows]
    picked = rows[-1]["auto_resolved"]
    fixed, fixed_misses = best_fixed(rows)
    picked_misses = sum(own_miss(picked, r) for r in rows)
    out = {"t5": t5, "mpi": mpi, "below": below, "picked": picked, "fix": "", "cls": "noise"}
    why = []
    if any(t5):
        if picked_misses >= half and fixed is not None and fixed != picked and fixed_misses < picked_misses:
            out["cls"], out["fix"] = "systematic: table", fixed
            why.append(f"{picked}'s own row misses in {picked_misses} of {n} runs, {fixed} in {fixed_misses}")
        else:
            why.append(f"T5 missed in {sum(t5)} of {n}; {picked}'s own row misses in {picked_misses}, "
                       f"the best fixed choice ({fixed}) in {fixed_misses}")
    if any(below):
        picked_below = [bool(r.get("mpi_us")) and picked in r["times"] and r["mpi_us"] / r["times"][picked] < mpi_margin
                        for r in rows]
        if sum(below) >= half and sum(best_below) >= half:
            out["cls"] = "systematic: algorithm"
            why.append(f"under {mpi_margin:.2f}x MPI in {sum(below)} of {n} runs, commlib's best row too in {sum(best_below)}")
        elif sum(below) >= half and sum(picked_below) >= half:
            out["cls"] = "systematic: table (MPI)"
            out["fix"] = min(rows[0]["times"], key=lambda a: sum(
                not (r.get("mpi_us") and a in r["times"] and r["mpi_us"] / r["times"][a] >= mpi_margin) for r in rows))
            why.append(f"under {mpi_margin:.2f}x MPI in {sum(below)} of {n} runs, {picked}'s own row too in "
                       f"{sum(picked_below)}, commlib's best row in {sum(best_below)}")
        else:
            why.append(f"under {mpi_margin:.2f}x MPI in {sum(below)} of {n} runs ({picked}'s own row in "
                       f"{sum(picked_below)}, commlib's best row in {sum(best_below)})")
    out["why"] = "; ".join(why)
    return out


def table(datas, P=4, mpi_margin=1.05):
    """[(collective, bytes, classify(...))] for every point that loses in any run, in the runs' order."""
    runs = [points(d, P) for d in datas]
    keys = [k for k in runs[0] if all(k in r for r in runs[1:])]
    out = []
    for k in keys:
        c = classify([r[k] for r in runs], mpi_margin)
        if any(c["t5"]) or any(c["below"]):
            out.append((k[0], k[1], c))
    return out


def splice(rows, lo, hi, algorithm):
    """A table's rows ([[up_to_bytes, algorithm], ..., [-1, algorithm]]) with ``algorithm`` for every
    size in (lo, hi] and every other size as before; neighbouring rows of one algorithm merged."""
    segs, start = [], 0  # (first size excluded, last size included or -1, algorithm)
    for up, alg in rows:
        segs.append((start, up, alg))
        start = up
    out = []

    def add(up, alg):
        if out and out[-1][1] == alg:
            out[-1][0] = up
        else:
            out.append([up, alg])

    for a, b, alg in segs:
        inf_b = math.inf if b < 0 else b
        if a < lo:
            add(min(inf_b, lo), alg)
        if inf_b > lo and a < hi:
            add(hi if hi != math.inf else -1, algorithm)
        if inf_b > hi:
            add(b, alg)
    return out


def apply_fixes(table, classes, sizes, P, dtype="float32"):
    """``table`` with each "systematic: table" point's fix in the rows of world size ``P`` (see
    splice), from halfway to the measured bench ``sizes`` either side; returns (table, [what changed])."""
    import copy
    table = copy.deepcopy(table)
    done = []
    for coll, nbytes, c in classes:
        if c["cls"] != "systematic: table":
            continue
        entry = table["collectives"][coll][str(P)]
        measured = sorted({core_bytes(coll, b, dtype, P) for b in sizes if b > 0})
        at = core_bytes(coll, nbytes, dtype, P)
        i = measured.index(at)
        lo = int(math.sqrt(measured[i - 1] * at)) if i > 0 else 0
        hi = int(math.sqrt(at * measured[i + 1])) if i + 1 < len(measured) else -1
        entry["rows"] = splice(entry["rows"], lo, hi if hi > 0 else math.inf, c["fix"])
        done.append(f"{coll}.{P}: {c['fix']} for {lo + 1}-{hi if hi > 0 else 'any'} B a rank "
                    f"(was {c['picked']}; bench size {fmt_bytes(nbytes)})")
    return table, done


def _cell(row, miss, ratio, below):
    t5 = f"{'**' if miss else ''}{row['auto_us'] / row['best_us']:.2f}{'**' if miss else ''}" if row["auto_us"] else "-"
    m = "-" if ratio is None else f"{'**' if below else ''}{ratio:.2f}{'**' if below else ''}"
    return f"{t5} / {m}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mpi-margin", type=float, default=1.05)
    p.add_argument("--table", default=core_tuning.default_path(),
                   help="the single-copy crossover --single-copy-ab runs are read with (default: the shipped table)")
    p.add_argument("--apply", metavar="TABLE", help="write TABLE with the table fixes spliced in to -o")
    p.add_argument("-o", "--output", metavar="OUT")
    a = p.parse_args(argv)
    if a.apply and not a.output:
        p.error("--apply needs -o OUT")
    crossover = core_tuning.read(a.table)
    raw = [json.load(open(x)) for x in a.runs]
    # the crossover as it applies on each run's machine class (the table's "machines" sections)
    datas = [as_shipped(d, crossover and core_tuning.for_machine(crossover, d.get("machine") or None), a.ranks)
             for d in raw]
    runs = [points(d, a.ranks) for d in datas]
    head = ["point", "auto runs"] + [f"run {i + 1}" for i in range(len(datas))] + ["class", "fix", "why"]
    print("cells: auto over the run's best / Open MPI over auto; **bold**: a loss (T5 miss, under the MPI margin)\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for coll, nbytes, c in table(datas, a.ranks, a.mpi_margin):
        rows = [r[(coll, nbytes)] for r in runs]
        cells = [_cell(r, m, x, b) for r, m, x, b in zip(rows, c["t5"], c["mpi"], c["below"])]
        print("| " + " | ".join([f"{coll} {fmt_bytes(nbytes)}", c["picked"]] + cells + [c["cls"], c["fix"], c["why"]]) + " |")
    if a.apply:
        sizes = sorted({r["bytes"] for d in datas for r in d["results"] if r["world_size"] == a.ranks})
        new, done = apply_fixes(core_tuning.read(a.apply), table(datas, a.ranks, a.mpi_margin), sizes, a.ranks)
        with open(a.output, "w") as f:
            json.dump(new, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"\n# {a.output}: " + ("; ".join(done) if done else "no table fixes"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
