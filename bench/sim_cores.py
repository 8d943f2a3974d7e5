"""Validation (b), ranks beyond the cores: 2, 4 and 8 ranks on shared memory on a 2-core machine
(the committed bench run summarised in bench/results/summary.csv, runs np2, np4, np8).
Used by bench/sim_validate.py, which writes bench/RESULTS_sim.md.

The topology is fitted on the 2-rank rows alone (``fitted:``, memory tiers included: 2 ranks on 2
cores, not oversubscribed); then the CPU-scheduling terms (docs/simulator.md, "Waiting"):

- ``cores_per_host``: the run's machine's cores (2), so 4 ranks are oversubscribed by 2 and 8 by 4;
- ``spin_us`` 20 (COMMLIB_SPIN_US's default); ``wake_us`` 0 (inside the quantum, below);
- ``sched_quantum_us``: fitted on the 4-rank ring all_reduce rows up to FIT_BYTES; every other
  4-rank row and every 8-rank row (where each receive waits 3 quanta, not 1) is out of sample.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import statistics
import sys

CSV = os.path.join("bench", "results", "summary.csv")
SUMMARY = "shm_np248.json"   # in bench/sim_data/: the commlib rows of the CSV's np2/np4/np8 runs
RUNS = ("np2", "np4", "np8")
FIT_BYTES = 4096
SPIN_US = 20.0
FIT_ON = ("all_reduce", "all_to_all")
BANDS = (("small", "< 32 KiB"), ("mid", "32-256 KiB"), ("big", ">= 512 KiB"))


def summarize_csv(root, dst):
    """The commlib rows (out of place, not auto) of the CSV's np2/np4/np8 runs, as a bench-style
    summary with each run's machine line; rewrites ``dst``."""
    meta, rows = {}, []
    with open(os.path.join(root, CSV)) as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("# run "):
            name, blob = line[len("# run "):].split(" ", 1)
            if name in RUNS:
                d = json.loads(blob)
                meta[name] = {"command": d.get("command"), "machine": d.get("machine")}
    for r in csv.DictReader(line for line in lines if not line.startswith("#")):
        if r["run"] in RUNS and r["backend"] == "commlib" and r["mode"] == "out" and r["algorithm"] != "auto":
            rows.append({"backend": "commlib", "transport": r["transport"], "collective": r["collective"],
                         "algorithm": r["algorithm"], "world_size": int(r["world_size"]), "dtype": r["dtype"],
                         "bytes": int(r["bytes"]), "root": int(r["root"]),
                         "time_us": {"median": round(float(r["median_us"]), 3)}})
    with open(dst, "w") as f:
        json.dump({"source": f"{CSV} (runs {', '.join(RUNS)}, commlib rows, out of place)", "runs": meta,
                   "results": rows}, f, indent=0)
        f.write("\n")


def _predict(r, topo):
    from commlib import sim
    return sim.predict(r["collective"], r["algorithm"], r["bytes"], r["world_size"], topo, r["dtype"],
                       max(r.get("root", 0), 0))["time_us"]["median"]


def _band(nbytes):
    return "small" if nbytes < 32 << 10 else ("mid" if nbytes < 512 << 10 else "big")


def section(lines, data_dir, fmt_bytes):
    """Appends the section; returns {ranks: (median |error| before, after)} (empty without data)."""
    from commlib import sim
    from commlib.sim.fit_sched import fit_monotone
    path = os.path.join(data_dir, SUMMARY)
    if not os.path.exists(path):
        lines += ["### Ranks beyond the cores: no data", "", f"No `bench/sim_data/{SUMMARY}`.", ""]
        return {}
    with open(path) as f:
        data = json.load(f)
    shm = sim.from_bench(path, world_size=2, collectives=FIT_ON)
    cores = int(data["runs"]["np4"]["machine"]["cores"])
    by_p = {}
    for r in data["results"]:
        by_p.setdefault(r["world_size"], []).append(r)

    def topo(P, quantum=None):
        t = dataclasses.replace(shm, name=f"shm-{P}", devices_per_host=P)
        if quantum is None:
            return t
        return dataclasses.replace(t, cores_per_host=cores, spin_us=SPIN_US, wake_us=0.0, sched_quantum_us=quantum)

    ring4 = [r for r in by_p[4] if r["collective"] == "all_reduce" and r["algorithm"] == "ring"]
    quantum = fit_monotone(ring4, lambda v: topo(4, v), max_bytes=FIT_BYTES)
    m = data["runs"]["np4"]["machine"]
    lines += [f"### Ranks beyond the cores: 2, 4 and 8 ranks on {cores} cores (shared memory)", "",
              f"The bench run summarised in `{CSV}` (runs {', '.join(RUNS)}: `commlib bench --np P`, every "
              f"algorithm, 8 B..16 MiB, -f 4) on {m.get('cpu', '?')} ({cores} cores), {m.get('date', '?')}, a quieter "
              f"machine than the run above (2-rank 8 B all_reduce 1.2 us: the peer found spinning); its commlib "
              f"rows are committed as `bench/sim_data/{SUMMARY}`.", "",
              f"Topology: `fitted:` on the 2-rank {', '.join(FIT_ON)} rows alone ({shm.call_overhead_us:.2f} us per "
              f"call, {shm.intra_latency_us:.2f} us per message, port {shm.intra_GBps:.1f} GB/s in cache). "
              "**before**: that topology at 4 and 8 ranks, a core per rank. **after** (docs/simulator.md, "
              f"\"Waiting\"): `cores_per_host` {cores}, so 4 ranks share each core by 2 and 8 by 4: software "
              "costs and byte rates scale by that, and every receive waits (f - 1) x `sched_quantum_us` for "
              f"its core, `sched_quantum_us` = {quantum:.2f} us fitted on the 4-rank ring all_reduce rows up to "
              f"{fmt_bytes(FIT_BYTES)}; every other row is out of sample, the 8-rank ones (3 quanta per receive) "
              f"entirely. `spin_us` {SPIN_US:g} (COMMLIB_SPIN_US), `wake_us` 0 (inside the quantum).", "",
              "| ranks | collective | algorithm | size | measured (us) | before (us) | error | after (us) | error |",
              "|---|---|---|---|---|---|---|---|---|"]
    errs, summary = {}, {}
    shown = {"all_reduce": "ring", "all_to_all": "pairwise"}
    for P in sorted(by_p):
        before, after = topo(P), topo(P, quantum)
        for r in by_p[P]:
            meas, q0, q1 = r["time_us"]["median"], _predict(r, before), _predict(r, after)
            e0, e1 = (q0 - meas) / meas, (q1 - meas) / meas
            for key in ((P, r["collective"], _band(r["bytes"])), (P, "all", "all")):
                errs.setdefault(key, []).append((abs(e0), abs(e1)))
            if P > 2 and shown.get(r["collective"]) == r["algorithm"]:
                lines.append(f"| {P} | {r['collective']} | {r['algorithm']} | {fmt_bytes(r['bytes'])} | {meas:.1f} | "
                             f"{q0:.1f} | {e0 * 100:+.0f}% | {q1:.1f} | {e1 * 100:+.0f}% |")
        summary[P] = tuple(statistics.median(e[i] for e in errs[(P, "all", "all")]) for i in (0, 1))

    def cell(key):
        if key not in errs:
            return "-"
        return " -> ".join(f"{statistics.median(e[i] for e in errs[key]) * 100:.0f}%" for i in (0, 1))

    def span(P, i):
        meds = [statistics.median(e[i] for e in v) * 100 for k, v in errs.items() if k[0] == P and k[2] == "small"]
        return f"{min(meds):.0f}-{max(meds):.0f} %"

    lines += ["", "Median |error| over every algorithm, by size band (before -> after):", "",
              "| ranks | collective | " + " | ".join(label for _, label in BANDS) + " |",
              "|---|---|" + "---|" * len(BANDS)]
    for P in sorted(by_p):
        for coll in sorted({k[1] for k in errs if k[0] == P and k[1] != "all"}):
            lines.append(f"| {P} | {coll} | " + " | ".join(cell((P, coll, b)) for b, _ in BANDS) + " |")
    lines += ["", "Where it is off, and why:", "",
              "- 2 ranks: unchanged (2 ranks on 2 cores are not oversubscribed).",
              "- Below 32 KiB, median |error| per collective: " + "; ".join(
                  f"{P} ranks {span(P, 0)} before, {span(P, 1)} after" for P in sorted(by_p) if P > 2) + ". One "
              "quantum per receive per extra rank per core is linear in the oversubscription; at 8 ranks the "
              "measured cost per step grows less than that (ring all_reduce over-predicted by 30-60 %, "
              "pairwise all_to_all within 16 %): how the kernel picks among 4 runnable ranks per core is not "
              "modelled.",
              "- From 128 KiB the 4- and 8-rank runs remain under-predicted (25-65 %, more at 8 ranks): the ranks "
              "share the caches and the memory bus as well as the cores, and the memory tiers are per rank, "
              "fitted at 2 ranks (docs/simulator.md, Limits).",
              ""]
    return summary


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--summarize":
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        summarize_csv(root, os.path.join(root, "bench", "sim_data", SUMMARY))
        sys.exit(0)
    sys.exit("run bench/sim_validate.py (or this file with --summarize to rewrite the summary from the CSV)")
