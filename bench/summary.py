"""The compact CSV summary of a results run (bench/results/summary.csv, kept in git).

The raw ``commlib bench --json`` files of a run (bench/results/*.json, 3 MB, every sample) are
build outputs and stay out of git; this file keeps what the reports are made of: per run, one
``# run`` line (the command, machine, backends, memcpy reference and model fit, as compact JSON),
then one CSV row per measured record. ``read`` rebuilds bench-JSON-shaped dicts from it, so
``python bench/results.py --from-csv bench/results/summary.csv`` regenerates
bench/RESULTS_collectives.md (and the report) without rerunning anything.
"""
from __future__ import annotations

import csv
import io
import json

SCHEMA = "commlib-bench-summary/1"
FIELDS = ("run", "backend", "transport", "collective", "algorithm", "resolved", "mode", "world_size", "dtype",
          "op", "root", "bytes", "count", "iters", "median_us", "min_us", "max_us", "algbw_GBps", "busbw_GBps",
          "wrong", "loop_avg_us", "cpu_us")
INTS = ("world_size", "root", "bytes", "count", "iters", "wrong")
FLOATS = ("median_us", "min_us", "max_us", "algbw_GBps", "busbw_GBps")
META = ("command", "machine", "config", "world_size", "timing", "backends", "memcpy", "model")


def _g(x):
    """Exact (repr): rounded values can flip a printed digit, and the Markdown must regenerate
    identically from the summary."""
    return "" if x is None else repr(float(x))


def write(path, runs, commands):
    """``runs``: [(name, bench dict)]; ``commands``: the lines RESULTS_collectives.md shows."""
    out = io.StringIO()
    out.write(f"# {SCHEMA}\n")
    for c in commands:
        out.write("# command " + json.dumps(c) + "\n")
    for name, d in runs:
        meta = {k: d.get(k) for k in META if k in d}
        out.write(f"# run {name} " + json.dumps(meta, sort_keys=True, separators=(",", ":")) + "\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(FIELDS)
    for name, d in runs:
        for r in d["results"]:
            t = r["time_us"]
            w.writerow([name, r["backend"], r["transport"], r["collective"], r["algorithm"], r.get("resolved", ""),
                        r["mode"], r["world_size"], r["dtype"], r["op"], r.get("root", -1), r["bytes"], r["count"],
                        r["iters"], _g(t["median"]), _g(t["min"]), _g(t["max"]), _g(r["algbw_GBps"]),
                        _g(r["busbw_GBps"]), r["wrong"], _g(t.get("loop_avg")), _g(r.get("cpu_us"))])
    with open(path, "w") as f:
        f.write(out.getvalue())


def read(path):
    """(commands, [(name, bench dict)]) from a summary written by :func:`write`."""
    commands, runs, order = [], {}, []
    rows = []
    with open(path) as f:
        first = f.readline().strip()
        if first != f"# {SCHEMA}":
            raise ValueError(f"{path}: not a {SCHEMA} file")
        for line in f:
            if line.startswith("# command "):
                commands.append(json.loads(line[len("# command "):]))
            elif line.startswith("# run "):
                name, meta = line[len("# run "):].split(" ", 1)
                d = json.loads(meta)
                d.update(schema="commlib-bench/1", results=[])
                runs[name] = d
                order.append(name)
            else:
                rows.append(line)
    for row in csv.DictReader(rows):
        rec = {k: v for k, v in row.items() if k != "run"}
        for k in INTS:
            rec[k] = int(rec[k])
        for k in FLOATS:
            rec[k] = float(rec[k]) if rec[k] != "" else None
        rec["time_us"] = {"median": rec.pop("median_us"), "min": rec.pop("min_us"), "max": rec.pop("max_us")}
        # the loop average (the throughput beside the per-call median: a root that runs ahead of its
        # readers shows in the median, not in it); summaries written before it have no such column
        loop = rec.pop("loop_avg_us", None)
        if loop not in (None, ""):
            rec["time_us"]["loop_avg"] = float(loop)
        # all ranks' CPU time per call (the sweep's cpu_us), in summaries written from session 21 on
        cpu = rec.pop("cpu_us", None)
        if cpu not in (None, ""):
            rec["cpu_us"] = float(cpu)
        runs[row["run"]]["results"].append(rec)
    return commands, [(n, runs[n]) for n in order]
