"""Validates the simulator and writes bench/RESULTS_sim.md (docs/simulator.md explains the model).

    .venv/bin/python bench/sim_validate.py [--measure] [--bench np2.json] [-o bench/RESULTS_sim.md]

(a) the closed forms of docs/simulator.md on a uniform topology without contention (exact, also a test);
(b) predicted vs measured for our own runs: 2 ranks on shared memory (the topology fitted, memory
    tier included, on the all_reduce and all_to_all rows and checked on every collective), and
    all_reduce across 2 emulated hosts joined by rate-limited TCP links (bench/sim_tcp.py), and 4
    and 8 ranks on the 2 cores of the machine fitted at 2 (ranks beyond the cores; bench/sim_cores.py). The
    bench summaries are committed in bench/sim_data/; ``--measure`` reruns the benches (the netns
    runs need root and are skipped, saying so, without it);
(c) NCCL's published 8x H100 all_reduce bus bandwidth against the dgx-h100 preset and ring;
(g) NCCL's published multi-node numbers against its multi-channel rail ring (bench/sim_rails.py);
(h) the overlapped hierarchical all_reduce against its phases alone (bench/sim_overlap.py);
plus the time the simulator takes for 4096 ranks.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from commlib import sim  # noqa: E402
import commlib._C as _C
from commlib.perf import model  # noqa: E402
from commlib.perf.common import fmt_bytes  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim_cores  # noqa: E402
import sim_overlap  # noqa: E402
import sim_rails  # noqa: E402
import sim_scale  # noqa: E402
import sim_small  # noqa: E402
import sim_tcp  # noqa: E402
from sim_inputs import require  # noqa: E402

NCCL_H100_BUSBW = 370.0  # GB/s, nccl-tests all_reduce_perf, 8x H100 SXM, large messages (see below)


def closed_forms(lines):
    import importlib.util
    spec = importlib.util.spec_from_file_location("cf", os.path.join(ROOT, "tests", "sim", "test_closed_forms.py"))
    cf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cf)
    lines += ["## (a) Closed forms (docs/simulator.md) on a uniform topology without contention", "",
              f"alpha {cf.ALPHA * 1e6:g} us, beta 1/{1 / cf.BETA / 1e9:g} GB/s, gamma 1/{1 / cf.GAMMA / 1e9:g} "
              "GB/s; every rank its own host and NIC; no chunking or overheads. Same check as "
              "tests/sim/test_closed_forms.py.", "",
              "| collective | algorithm | P | n | formula (us) | simulated (us) | rel. error |", "|---|---|---|---|---|---|---|"]
    worst = 0.0
    for coll, alg in cf.CASES:
        for P in (8, 64, 1024):
            n = P * P * 4 * 256
            f, s = cf.closed_form(coll, alg, n, P), cf.simulated(coll, alg, n, P)
            err = abs(s - f) / f
            worst = max(worst, err)
            lines.append(f"| {coll} | {alg} | {P} | {fmt_bytes(n)} | {f * 1e6:.3f} | {s * 1e6:.3f} | {err:.1e} |")
    lines += ["", f"Largest relative error: {worst:.1e} (floating-point rounding).", ""]


DATA = os.path.join(ROOT, "bench", "sim_data")
SHM_SUMMARY = os.path.join(DATA, "shm_np2.json")
SHM_BENCH = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "--np", "2", "-b", "8", "-e", "32M",
             "-f", "2", "--peers", "none", "--passes", "3", "--mode", "out"]


def run_bench(path, args):
    cmd = [sys.executable, "-m", "commlib", "bench", *args, "--json", path]
    print("# running", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def summarize(src, dst):
    """The part of a bench JSON file the validation reads (commlib rows, medians): small enough to
    commit, so RESULTS_sim.md regenerates without rerunning the bench."""
    with open(src) as f:
        data = json.load(f)
    keep = ("backend", "transport", "collective", "algorithm", "resolved", "world_size", "dtype", "bytes", "root")
    rows = [dict({k: r.get(k) for k in keep}, time_us={"median": round(r["time_us"]["median"], 3)})
            for r in data["results"] if r.get("backend") == "commlib"]
    out = {k: data.get(k) for k in ("command", "machine", "topology", "hosts") if data.get(k) is not None}
    out["results"] = rows
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


SHOWN = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring", "all_to_all": "pairwise",
         "broadcast": "binomial"}
FIT_ON = ("all_reduce", "all_to_all")


def _error(r, topo):
    p = sim.predict(r["collective"], r["algorithm"], r["bytes"], r["world_size"], topo, r["dtype"],
                    max(r.get("root", 0) or 0, 0))
    m, q = r["time_us"]["median"], p["time_us"]["median"]
    return m, q, (q - m) / m


def _rate(v):
    return "free" if v is None or math.isinf(v) else f"{v:.2f} GB/s"


def measured_vs_predicted(lines, bench_path, fit_on=FIT_ON):
    with open(require(bench_path, "run bench/sim_validate.py --measure, or pass --bench a 2-rank shared-memory "
                                  "bench --json file")) as f:
        data = json.load(f)
    one = sim.from_bench(bench_path, collectives=fit_on, tiers=False)
    topo = sim.from_bench(bench_path, collectives=fit_on)
    src = topo.sources["intra_latency_us"].rsplit(":", 1)[0]
    lines += ["### 2 ranks on shared memory", "",
              f"Bench run: `{data.get('command', '?')}` on {data.get('machine', {}).get('cpu', '?')} "
              f"({data.get('machine', {}).get('cores', '?')} cores), {data.get('machine', {}).get('date', '')}; "
              f"its commlib rows are committed as `bench/sim_data/{os.path.basename(bench_path)}`.", "",
              f"Topology `fitted:` on the {', '.join(fit_on)} rows only ({src}); the other collectives are out of "
              "sample. Two fits of the same rows:", "",
              f"- **one level** (before): per call {one.call_overhead_us:.2f} us, per message "
              f"{one.intra_latency_us:.2f} us, port {one.intra_GBps:.2f} GB/s, reduction {_rate(one.reduce_GBps)}, "
              f"copy {_rate(one.copy_GBps)};",
              f"- **memory tiers** (after): per call {topo.call_overhead_us:.2f} us, per message "
              f"{topo.intra_latency_us:.2f} us; in cache: port {topo.intra_GBps:.2f} GB/s, reduction "
              f"{_rate(topo.reduce_GBps)}, copy {_rate(topo.copy_GBps)}" + "".join(
                  f"; beyond {fmt_bytes(m['above_bytes'])} per rank: port {_rate(m['intra_GBps'])}, reduction "
                  f"{_rate(m['reduce_GBps'])}, copy {_rate(m['copy_GBps'])}" for m in topo.resolved_tiers()) + ". "
              f"The cut: {topo.sources['memory_tiers'].split(': ', 2)[-1]}.", "",
              "The working set of a rank is its input, output and the schedule's scratch buffer (a 2-rank ring "
              "all_reduce of n bytes: 2n). The table shows one algorithm per collective; the medians below cover "
              "every algorithm measured.", "",
              "| collective | algorithm | size | measured (us) | one level (us) | error | memory tiers (us) | error |",
              "|---|---|---|---|---|---|---|---|"]
    errs, errs_one = {}, {}
    for r in data["results"]:
        if r["backend"] != "commlib" or r["algorithm"] == "auto":
            continue
        m, q1, e1 = _error(r, one)
        _, q, e = _error(r, topo)
        band = "small" if r["bytes"] < 64 << 10 else ("mid" if r["bytes"] < 2 << 20 else "big")
        errs.setdefault((r["collective"], band), []).append(abs(e))
        errs_one.setdefault((r["collective"], band), []).append(abs(e1))
        if SHOWN.get(r["collective"]) == r["algorithm"]:
            lines.append(f"| {r['collective']} | {r['algorithm']} | {fmt_bytes(r['bytes'])} | {m:.2f} | {q1:.2f} | "
                         f"{e1 * 100:+.0f}% | {q:.2f} | {e * 100:+.0f}% |")
    lines += ["", "Median |error| over every algorithm, by size band (one level -> memory tiers):", "",
              "| collective | < 64 KiB | 64 KiB - 1 MiB | >= 2 MiB |", "|---|---|---|---|"]
    for coll in sorted({c for c, _ in errs}):
        cells = [f"{statistics.median(errs_one[(coll, b)]) * 100:.0f}% -> {statistics.median(errs[(coll, b)]) * 100:.0f}%"
                 if (coll, b) in errs else "-" for b in ("small", "mid", "big")]
        lines.append(f"| {coll}{'' if coll in fit_on else ' (out of sample)'} | " + " | ".join(cells) + " |")
    lines.append("")
    return topo


def nccl_h100(lines):
    topo = sim.load("dgx-h100")
    lines += ["## (c) NCCL's 8x H100 all_reduce bus bandwidth from the dgx-h100 preset", "",
              f"Reference: nccl-tests `all_reduce_perf -b 8 -e 8G -f 2 -g 8` on one 8x H100 SXM node reaches "
              f"about {NCCL_H100_BUSBW:.0f} GB/s bus bandwidth for large messages (NVIDIA's published "
              "DGX H100 results and many independent runs; NVLS/SHARP off, i.e. the ring algorithm).", "",
              "Prediction: the `ring` schedule on `dgx-h100` (8 GPUs, one host). The parameters that matter "
              "for large messages:", "",
              f"- NVLink 4 per GPU per direction: {topo.intra_GBps:g} GB/s ({topo.sources['intra_GBps']}).",
              f"- protocol efficiency {topo.intra_efficiency:.3f}: {topo.sources['intra_efficiency']}. "
              f"Effective port: {topo.intra_GBps * topo.intra_efficiency:.1f} GB/s. This is the one number that "
              "sets ring busbw; it is taken from NCCL's own model, not fitted to the reference.",
              f"- reduction {topo.reduce_GBps:.0f} GB/s ({topo.sources['reduce_GBps']}), overlapped with "
              f"transfers in {fmt_bytes(topo.chunk_bytes)} chunks ({topo.sources['chunk_bytes']}).",
              f"- latency {topo.intra_latency_us:g} us per step ({topo.sources['intra_latency_us']}).", "",
              "| size | predicted time (us) | predicted busbw (GB/s) | vs 370 GB/s |", "|---|---|---|---|"]
    worst = 0.0
    for size in (64 << 20, 256 << 20, 1 << 30, 4 << 30, 8 << 30):
        r = sim.predict("all_reduce", "ring", size, 8, topo)
        dev = r["busbw_GBps"] / NCCL_H100_BUSBW - 1
        if size >= 1 << 30:
            worst = max(worst, abs(dev))
        lines.append(f"| {fmt_bytes(size)} | {r['time_us']['median']:.1f} | {r['busbw_GBps']:.1f} | {dev * 100:+.1f}% |")
    lines += ["", f"Largest deviation at 1 GiB and above: {worst * 100:.1f}% (target: within 15%).", ""]
    return worst


def scale_timing(lines):
    topo = sim.load("dgx-h100")
    t0 = time.perf_counter()
    r = sim.predict("all_reduce", "ring", 1 << 30, 4096, topo)
    wall = time.perf_counter() - t0
    lines += ["## Simulator speed", "",
              f"ring all_reduce, 1 GiB, 4096 ranks (512 dgx-h100 nodes): {r['sim']['steps']:,} steps played; "
              f"building and compacting the 4096 schedules {r['sim']['build_s']:.1f} s, event run "
              f"{r['sim']['run_s']:.1f} s, {wall:.1f} s in all on this machine "
              f"({r['sim']['shapes']} distinct step shapes). Predicted busbw {r['busbw_GBps']:.1f} GB/s "
              f"(a flat ring: every step moves 1 GiB / 4096 = 256 KiB per rank, 5.4 us on a 48.5 GB/s NIC "
              f"rail, plus the {topo.inter_latency_us:g} us inter-host latency and the per-message and "
              "per-step costs).", ""]


def small_messages(lines):
    lines += ["## (d) Small messages at scale (bench/sim_small.py)", "",
              "The per-message terms (LogGP's o and g: `send_overhead_us`, `recv_overhead_us` serialised per "
              "rank, `nic_gap_us` per NIC) and where the presets' numbers come from (each cited in the preset's "
              "`sources`). First a calibration check against NCCL's published tuning model, then what the "
              "terms change: direct (one message per peer, in one step) against recursive doubling (log2 P "
              "steps) at 1 KiB. Without o and g (the former model: per-op overhead not serialised, no message "
              "rate) direct was predicted cheaper the more peers it had; with them, it pays per peer.", ""]
    lines += sim_small.rows()
    lines.append("")


SCALE_HOW = "bench/sim_scale.py --json bench/sim_data/scale.json"
AUTO_SPEED_HOW = "bench/sim_auto_speed.py > bench/sim_data/auto_speed.md"
SCALE_KEYS = ("rows", "t4096", "wall_s", "jobs")


def auto_at_scale(lines):
    """(e): bench/sim_scale.py's committed sweep. Missing or unreadable is a SystemExit naming the
    file and the command that remakes it (like every other committed input: a validation that
    writes a hint and exits 0 would hide the failure)."""
    path = require(os.path.join(DATA, "scale.json"), f"run `{SCALE_HOW}`")
    try:
        with open(path) as f:
            data = json.load(f)
        missing = [k for k in SCALE_KEYS if k not in data]
    except (ValueError, TypeError) as e:  # not JSON, or JSON that is not an object
        raise SystemExit(f"invalid input {path} ({e}): run `{SCALE_HOW}`") from None
    if missing:
        raise SystemExit(f"invalid input {path} (no {', '.join(missing)}): run `{SCALE_HOW}`")
    lines += ["## (e) auto at scale (bench/sim_scale.py)", "",
              "auto (the engine's `resolve_algorithm` with the preset as its cost model) against every candidate "
              "it ranks: the flat algorithms, and hierarchical with the built-in exchange and with every flat "
              "algorithm across hosts. Ratios are predicted times (auto / the best candidate); this machine's "
              f"tuning table cleared. Sweep: {data['jobs']} processes on this 2-core VM shared with other "
              "sessions (last run 2026-11-29 16:47-17:29 UTC, load 10 -> 2.6; rail_lanes among the "
              "candidates).", ""]
    lines += sim_scale.markdown(data["rows"], data["t4096"], data["wall_s"], data["jobs"]).splitlines()
    lines.append("")


def auto_speed(lines):
    """(f): bench/sim_auto_speed.py's committed output (bench/sim_data/auto_speed.md); missing or
    empty is a SystemExit naming the file and the command that remakes it."""
    path = require(os.path.join(DATA, "auto_speed.md"), f"run `{AUTO_SPEED_HOW}`")
    with open(path) as f:
        body = f.read().rstrip()
    if not body:
        raise SystemExit(f"invalid input {path} (empty): run `{AUTO_SPEED_HOW}`")
    lines += ["## (f) auto's search at thousands of ranks (bench/sim_auto_speed.py)", ""]
    lines += body.splitlines() + [""]


RAILS_HOW = "bench/sim_rails.py --json bench/sim_data/rails.json"


def rails(lines):
    """(g): bench/sim_rails.py's committed sweep (bench/sim_data/rails.json); missing or unreadable is
    a SystemExit naming the file and the command that remakes it."""
    path = require(os.path.join(DATA, "rails.json"), f"run `{RAILS_HOW}`")
    try:
        with open(path) as f:
            data = json.load(f)
        body = sim_rails.markdown(data)
    except (ValueError, TypeError, KeyError) as e:
        raise SystemExit(f"invalid input {path} ({e}): run `{RAILS_HOW}`") from None
    lines += ["## (g) Rails: NCCL's multi-node ring against its published numbers (bench/sim_rails.py)", ""]
    lines += body + [""]


OVERLAP_HOW = "bench/sim_overlap.py --json bench/sim_data/overlap.json"


def overlap(lines):
    """(h): bench/sim_overlap.py's committed sweep (bench/sim_data/overlap.json)."""
    path = require(os.path.join(DATA, "overlap.json"), f"run `{OVERLAP_HOW}`")
    try:
        with open(path) as f:
            body = sim_overlap.markdown(json.load(f))
    except (ValueError, TypeError, KeyError) as e:
        raise SystemExit(f"invalid input {path} ({e}): run `{OVERLAP_HOW}`") from None
    lines += ["## (h) Pipelined hierarchical: intra- and inter-host phases overlapped (bench/sim_overlap.py)", ""]
    lines += body + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true",
                    help="run the benches again and rewrite bench/sim_data/ (shared memory: a few minutes; the "
                         "netns TCP runs: root only, skipped otherwise)")
    ap.add_argument("--bench", help="a 2-rank shared-memory commlib bench --json file to use instead of "
                                    "bench/sim_data/shm_np2.json")
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "bench", "RESULTS_sim.md"))
    a = ap.parse_args(argv)
    tcp_note = "Committed summaries (bench/sim_data/), measured by an earlier `--measure` run as root."
    if a.measure:
        tmp = tempfile.mkdtemp(prefix="commlib-simval-")
        raw = os.path.join(tmp, "shm_np2.json")
        run_bench(raw, SHM_BENCH)
        summarize(raw, SHM_SUMMARY)
        tcp_note = sim_tcp.measure(ROOT, DATA, run_bench, summarize, tmp)
    lines = ["# Simulator validation", "",
             "Written by `bench/sim_validate.py` from the bench summaries in `bench/sim_data/` "
             "(`--measure` reruns the benches); the model is described in docs/simulator.md.", ""]
    closed_forms(lines)
    lines += ["## (b) Predicted vs measured, our own runs", ""]
    shm = measured_vs_predicted(lines, a.bench or SHM_SUMMARY)
    sim_tcp.section(lines, DATA, shm, tcp_note, fmt_bytes)
    sim_cores.section(lines, DATA, fmt_bytes)
    nccl_h100(lines)
    small_messages(lines)
    auto_at_scale(lines)
    auto_speed(lines)
    rails(lines)
    overlap(lines)
    scale_timing(lines)
    with open(a.output, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    print(f"# wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
