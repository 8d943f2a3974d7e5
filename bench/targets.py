"""Check issue 3's performance targets against bench JSON files; print a Markdown table.

    python bench/targets.py np2.json np4.json [np8.json ...]

Every figure is a ratio between numbers of the same run (commlib's best algorithm, auto, gloo, MPI
and one-thread memcpy); nothing here is asserted in tests. Targets:

  T1 all_reduce, 2 ranks, 8 B-1 KiB: commlib latency <= 1.5x OpenMPI
  T2 all_reduce, 2 ranks, 16-64 MiB: busbw >= 1x OpenMPI, >= 4x gloo, >= 50% of one-thread memcpy
  T3 all_reduce, 4 and 8 ranks: no slower than OpenMPI at every size
  T4 all_gather, reduce_scatter, all_to_all, broadcast: best algorithm no slower than OpenMPI at
     every size, >= 4x gloo at 16 MiB
  T5 auto within 10% of the best measured algorithm at every size (T5': the same for the row of
     the algorithm auto ran, which separates the choice from the noise of auto's own row)
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commlib.bench import report  # noqa: E402
from commlib.perf.common import fmt_bytes  # noqa: E402
from commlib.bench.memcpy import largest  # noqa: E402

MiB = 1 << 20


def _fmt_list(items, limit=6):
    items = list(items)
    s = ", ".join(items[:limit])
    return s + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def memcpy_reference(datas):
    """(GB/s, bytes): one-thread memcpy at the largest size any run measured (out of cache)."""
    recs = [m for d in datas for m in (d.get("memcpy") or [])]
    if not recs:
        return 0.0, 0
    top = max(m["bytes"] for m in recs)
    return largest([m for m in recs if m["bytes"] == top]), top


def evaluate(datas):
    rows = report.comparison(report.merged_records(datas))
    mem, mem_bytes = memcpy_reference(datas)
    out = []

    def add(target, P, sel, ok_fn, show_fn, empty="not measured"):
        if not sel:
            out.append([target, P, empty, "–"])
            return
        bad = [r for r in sel if not ok_fn(r)]
        ends = sel[:1] + sel[-1:] if len(sel) > 1 else sel
        shown = _fmt_list(f"{fmt_bytes(r['bytes'])}: {show_fn(r)}" for r in (bad or ends))
        verdict = "met" if not bad else f"missed at {len(bad)}/{len(sel)} sizes"
        out.append([target, P, (f"misses: {shown}" if bad else f"e.g. {shown}"), verdict])

    def x(a, b):
        return f"{a / b:.2f}x" if a and b else "n/a"

    ar = [r for r in rows if r["collective"] == "all_reduce"]
    t1 = [r for r in ar if r["world_size"] == 2 and r["bytes"] <= 1024 and r["mpi_us"]]
    add("T1 all_reduce 8 B-1 KiB latency <= 1.5x MPI", 2, t1,
        lambda r: r["best_us"] <= 1.5 * r["mpi_us"],
        lambda r: f"{r['best_us']:.1f} us vs MPI {r['mpi_us']:.1f} us ({x(r['best_us'], r['mpi_us'])})")
    t2 = [r for r in ar if r["world_size"] == 2 and 16 * MiB <= r["bytes"] <= 64 * MiB]
    add("T2a all_reduce 16-64 MiB busbw >= 1x MPI", 2, [r for r in t2 if r["mpi_busbw"]],
        lambda r: r["best_busbw"] >= r["mpi_busbw"],
        lambda r: f"{r['best_busbw']:.2f} vs {r['mpi_busbw']:.2f} GB/s ({x(r['best_busbw'], r['mpi_busbw'])})")
    add("T2b all_reduce 16-64 MiB busbw >= 4x gloo", 2, [r for r in t2 if r["gloo_busbw"]],
        lambda r: r["best_busbw"] >= 4 * r["gloo_busbw"],
        lambda r: f"{r['best_busbw']:.2f} vs {r['gloo_busbw']:.2f} GB/s ({x(r['best_busbw'], r['gloo_busbw'])})")
    add("T2c all_reduce 16-64 MiB busbw >= 50% memcpy", 2, t2 if mem else [],
        lambda r: r["best_busbw"] >= 0.5 * mem,
        lambda r: f"{r['best_busbw']:.2f} GB/s = {100 * r['best_busbw'] / mem:.0f}% of {mem:.1f} GB/s "
                  f"(memcpy at {fmt_bytes(mem_bytes)})")
    for P in (4, 8):
        add("T3 all_reduce no slower than MPI", P, [r for r in ar if r["world_size"] == P and r["mpi_us"]],
            lambda r: r["best_us"] <= r["mpi_us"],
            lambda r: f"{r['best_us']:.1f} vs {r['mpi_us']:.1f} us ({x(r['best_us'], r['mpi_us'])})")
    for coll in ("all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        for P in sorted({r["world_size"] for r in rows if r["collective"] == coll}):
            sel = [r for r in rows if r["collective"] == coll and r["world_size"] == P]
            add(f"T4 {coll} best no slower than MPI", P, [r for r in sel if r["mpi_us"]],
                lambda r: r["best_us"] <= r["mpi_us"],
                lambda r: f"{r['best_us']:.1f} vs {r['mpi_us']:.1f} us ({x(r['best_us'], r['mpi_us'])})")
            add(f"T4 {coll} >= 4x gloo at 16 MiB", P, [r for r in sel if r["bytes"] == 16 * MiB and r["gloo_us"]],
                lambda r: r["gloo_us"] >= 4 * r["best_us"],
                lambda r: f"gloo {r['gloo_us']:.0f} us / commlib {r['best_us']:.0f} us = {x(r['gloo_us'], r['best_us'])}")
    for P in sorted({r["world_size"] for r in rows}):
        sel = [r for r in rows if r["world_size"] == P and r["auto_us"]]
        add("T5 auto within 10% of best (or runs the best algorithm)", P, sel,
            lambda r: r["auto_us"] <= 1.10 * r["best_us"] or r["auto_resolved"] == r["best"],
            lambda r: f"{r['collective']} auto {r['auto_us']:.1f} ({r['auto_resolved']}) vs "
                      f"{r['best']} {r['best_us']:.1f} us ({x(r['auto_us'], r['best_us'])})")
        # The same question about the choice alone: auto's own row is one more noisy sample of the
        # algorithm it runs, so also compare that algorithm's own row with the best.
        chose = [r for r in sel if r["times"].get(r["auto_resolved"])]
        add("T5' auto's choice (its algorithm's own row) within 10% of best", P, chose,
            lambda r: r["times"][r["auto_resolved"]] <= 1.10 * r["best_us"],
            lambda r: f"{r['collective']} {r['auto_resolved']} {r['times'][r['auto_resolved']]:.1f} vs "
                      f"{r['best']} {r['best_us']:.1f} us ({x(r['times'][r['auto_resolved']], r['best_us'])})")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    datas = report.load(a.files)
    rows = evaluate(datas)
    print("| target | ranks | measured (same run) | verdict |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
