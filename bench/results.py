"""Measure the collectives at several world sizes, regenerate auto's tuning file, write the report and
bench/RESULTS_collectives.md (the figures behind issue 3's targets).

    python bench/results.py                    # --np 2 4 8, default sweep, peers gloo+mpi, --tune,
                                               # and 2-rank all_reduce at 16-64 MiB
    python bench/results.py --np 2 4 --out-dir /tmp/res --no-tune
    python bench/results.py --from-json a.json b.json    # only rewrite the Markdown

Each world size is one ``commlib bench`` run (its own gloo and MPI jobs, same sizes), so every
ratio compares numbers of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from commlib.bench import common as C  # noqa: E402
from commlib.bench import model as M  # noqa: E402
from commlib.bench import report  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench"))
import targets  # noqa: E402


NOTES = "## What falls short, and why"


def run_bench(P, out_dir, tune, extra, name=None):
    path = os.path.join(out_dir, f"{name or f'np{P}'}.json")
    cmd = [sys.executable, "-m", "commlib", "bench", "--np", str(P), "--json", path] + (["--tune"] if tune else []) + extra
    print("$ " + " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rc = subprocess.call(cmd, env=env)
    print(f"# np {P}: exit {rc} in {time.monotonic() - t0:.0f} s", flush=True)
    return path, rc, time.monotonic() - t0


def _mem(datas):
    gbps, nbytes = targets.memcpy_reference(datas)
    return gbps, C.fmt_bytes(nbytes)


def markdown(datas, commands, report_dir):
    rows = report.comparison(report.merged_records(datas))
    m = datas[0]["machine"]
    out = ["# commlib collectives: measured results", ""]
    out.append(f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, {m.get('os')}; "
               f"Python {m.get('python')}, NumPy {m.get('numpy')}, torch {m.get('torch')} (gloo), "
               f"mpi4py {m.get('mpi4py')} / {report._mpi_lib(datas[0])}; commlib {m.get('commlib')} "
               f"{m.get('commlib_commit') or ''}; {m.get('date')}.")
    out.append("")
    out.append("Commands (one run per world size; gloo and MPI measured in the same run, same sizes):")
    out.append("")
    out.append("```")
    out += commands
    out.append("```")
    out.append("")
    out.append("Time = median over iterations of the slowest rank's time per call; busbw per nccl-tests "
               "(all_reduce 2(P-1)/P, all_gather / reduce_scatter / all_to_all (P-1)/P, broadcast 1). "
               "One-thread memcpy: {:.1f} GB/s at {}. ".format(*_mem(datas)) +
               f"Full report with plots: `{report_dir}/index.html`.")
    out.append("")
    out.append("## Targets (issue 3)")
    out.append("")
    out.append("| target | ranks | measured (same run) | verdict |")
    out.append("|---|---|---|---|")
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in targets.evaluate(datas)]
    out.append("")
    out.append("## commlib vs gloo vs MPI (median µs; ratio = peer / commlib, above 1× commlib is faster)")
    out.append("")
    out.append("| collective | ranks | size | commlib best (algorithm) | auto | gloo | MPI | gloo / commlib | "
               "MPI / commlib | commlib busbw GB/s | MPI busbw GB/s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    keep = {512, 32 << 10, 2 << 20, 16 << 20}
    for r in rows:
        first = min(x["bytes"] for x in rows if x["collective"] == r["collective"] and x["world_size"] == r["world_size"])
        if r["bytes"] not in keep and r["bytes"] != first:
            continue
        out.append(f"| {r['collective']} | {r['world_size']} | {C.fmt_bytes(r['bytes'])} | {report._us(r['best_us'])} "
                   f"({r['best']}) | {report._us(r['auto_us'])} | {report._us(r['gloo_us'])} | {report._us(r['mpi_us'])} | "
                   f"{report._x(report._ratio(r['gloo_us'], r['best_us']))} | {report._x(report._ratio(r['mpi_us'], r['best_us']))} | "
                   f"{report._f(r['best_busbw'])} | {report._f(r['mpi_busbw'])} |")
    out.append("")
    out.append("## Fitted alpha-beta-gamma (DESIGN.md §3, least squares on log time)")
    out.append("")
    out.append("| backend / transport / ranks | alpha µs | 1/beta GB/s | 1/gamma GB/s | median rel. error |")
    out.append("|---|---|---|---|---|")
    for d in datas:
        for k, v in sorted((d.get("model") or M.fit_results(d["results"])).items()):
            out.append(f"| {k} | {v['alpha'] * 1e6:.2f} | {report._f(1e-9 / v['beta'] if v['beta'] else None)} | "
                       f"{report._f(1e-9 / v['gamma'] if v['gamma'] else None)} | "
                       f"{(v['rel_err_median'] or 0) * 100:.0f}% |")
    out.append("")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--report", default=os.path.join(ROOT, "report"))
    p.add_argument("--md", default=os.path.join(ROOT, "bench", "RESULTS_collectives.md"))
    p.add_argument("--no-tune", action="store_true")
    p.add_argument("--no-large", dest="large", action="store_false",
                   help="skip the 2-rank all_reduce run at 16-64 MiB")
    p.add_argument("--from-json", nargs="+", metavar="JSON")
    a, extra = p.parse_known_args(argv)
    commands, paths = [], []
    if a.from_json:
        paths = a.from_json
        commands = [json.load(open(x)).get("command", "") for x in paths]
    else:
        os.makedirs(a.out_dir, exist_ok=True)
        for P in a.np:
            path, rc, secs = run_bench(P, a.out_dir, not a.no_tune, extra)
            if os.path.exists(path):
                paths.append(path)
                commands.append(json.load(open(path)).get("command", "") + f"    # {secs:.0f} s, exit {rc}")
        if a.large and 2 in a.np:  # all_reduce busbw at 16-64 MiB, 2 ranks (issue 3's T2)
            path, rc, secs = run_bench(2, a.out_dir, False, ["all_reduce", "-b", "16M", "-e", "64M", "-f", "2",
                                                            "-n", "10", "--mode", "in"], name="np2_large")
            if os.path.exists(path):
                paths.append(path)
                commands.append(json.load(open(path)).get("command", "") + f"    # {secs:.0f} s, exit {rc}")
    datas = report.load(paths)
    report.generate(datas, a.report)
    text = markdown(datas, commands, os.path.relpath(a.report, ROOT))
    if os.path.exists(a.md):  # keep the hand-written analysis of an earlier version
        old = open(a.md).read()
        if NOTES in old:
            text += "\n" + old[old.index(NOTES):]
    with open(a.md, "w") as f:
        f.write(text)
    print(f"# wrote {a.md} and {a.report}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
