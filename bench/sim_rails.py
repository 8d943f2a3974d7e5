"""Rails in the model (issue #39): NCCL's multi-node ring against its published numbers, and commlib's
algorithms on the DGX presets from 2 to 1024 nodes. Written to bench/sim_data/rails.json and, through
bench/sim_validate.py, to bench/RESULTS_sim.md section (g).

NCCL's own algorithm for large all_reduce across nodes is a multi-channel ring with one ring per
rail (each channel enters and leaves every node through a different GPU and NIC); commlib's
`rail_ring` (csrc/schedule/rail_ring.cc) is that schedule, so its prediction is the model's
prediction for NCCL. Published points (nccl-tests all_reduce_perf, large messages):
  * DGX H100, 8 x 400 Gbit/s NDR: 46-48 GB/s per NIC, about 370-385 GB/s busbw, at any node count;
  * 3 DGX A100 nodes with four 200 Gbit/s HDR NICs each: 85-96 GB/s busbw.
The dgx-a100 preset has eight HDR NICs (one per GPU); the published A100 point ran with four, so it
is checked on the preset with `nics` = 4 (GPU i uses NIC i % 4).

    python bench/sim_rails.py [--jobs N] [--json bench/sim_data/rails.json] [--quick | --nodes 128,1024
        [--algorithms auto] [--topologies dgx-h100] [--sizes 64,1024] [--missing] [--published]]

`--nodes` simulates those node counts only and merges the points into the JSON file's (a point
simulated again replaces its old value), so a long sweep can be run one node count at a time, and
`--algorithms` only some of ring, rail_ring and auto, `--topologies` and `--sizes` (MiB) only those
points (each such rerun is listed with its date and the machine's load); `--missing` skips the points the JSON file already holds; `--published` adds the
published points' rail_ring runs. Each point records the commit it was simulated at: after a change to the model,
rerun every point (`--nodes 2,16,128` and the 1024-node cells) rather than some, or the tables mix models.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from commlib import _C  # noqa: E402
from commlib import sim  # noqa: E402
from commlib.perf.common import fmt_bytes  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_rails_predictions import PREDICTIONS  # noqa: E402,F401 (markdown's, and tests read it here)

PUBLISHED = [  # (label, topology, nics override, nodes, low, high busbw GB/s)
    ("DGX H100, 8 x 400G NDR", "dgx-h100", None, (2, 4, 16), 370.0, 385.0),
    ("3 DGX A100, 4 x 200G HDR", "dgx-a100", 4, (3,), 85.0, 96.0),
]
NODES = (2, 16, 128, 1024)
# The tables' machines: (preset, nics override). The published A100 point's machine, dgx-a100 with 4
# NICs (two local ranks on each), has tables of its own since session 26 (docs/simulator.md,
# "NIC-shared hosts"): there commlib's best is checked against NCCL's published 85-96 GB/s itself.
TABLES = (("dgx-h100", None), ("dgx-a100", None), ("dgx-a100", 4))
SIZES = tuple(1 << k for k in range(20, 31, 2))  # 1 MiB .. 1 GiB, x4
ALGORITHMS = ("ring", "rail_ring", "auto")
BIG = 1 << 30  # the published points are large-message plateaus


def _topology(name, nics):
    t = sim.load(name)
    return t if nics is None else dataclasses.replace(t, name=f"{name}-{nics}nic", nics=nics)


def nic_floor(name, nics, nodes) -> float:
    """busbw (GB/s) of a hierarchical all_reduce bound only by its NICs' bytes: 2(H-1)/H of the buffer
    leaves and enters every host, spread over its nics NICs (NIC-shared hosts, docs/simulator.md)."""
    t = _topology(name.removesuffix(f"-{nics}nic"), nics)
    P, per_host = nodes * t.devices_per_host, t.nics * t.nic_Gbps / 8 * t.nic_efficiency
    return per_host * nodes / (nodes - 1) * (P - 1) / P


def _commit() -> str:
    """The checkout's commit, which each point records: a point keeps the model of the code it was run
    with, and a later change to the model leaves it stale until it is run again (session 34 found
    dgx-a100 rows up to 33 % off after partial reruns)."""
    import subprocess
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=8", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def _point(args):
    name, nics, nodes, alg, size = args
    _C.clear_tuning()  # this machine's measured table says nothing about the simulated cluster
    topo = _topology(name, nics)
    t0 = time.perf_counter()
    r = sim.predict("all_reduce", alg, size, nodes * topo.devices_per_host, topo)
    label = "/".join(x for x in (r["resolved"], r["inter_algorithm"], r["intra_algorithm"]) if x)
    if r["resolved"] == "rail_split":  # the rail rings' share of the buffer, as the model chose it
        label += f" ({r['sim']['share'] / 1024:.2f} rails)"
    return {"topology": topo.name, "nodes": nodes, "algorithm": alg, "bytes": size, "busbw_GBps": r["busbw_GBps"],
            "resolved": label, "wall_s": time.perf_counter() - t0, "commit": _commit()}


def sizes_for(nodes, alg):
    """The sizes simulated: every size at every node count (since session 29; before, at 1024 nodes only
    auto at 64 MiB, 256 MiB and 1 GiB). What a point costs grows with the ranks: at 128 nodes (1024
    ranks) a rail ring plays 2 x 1023 steps of 8 channels on every rank (16.7 M steps, 4-90 s a point
    here); at 1024 nodes (8192 ranks, SCALE_COST below, measured in session 29) a ring point 89 CPU-s, auto
    80-350 below 64 MiB and 375-1100 s wall from it, a rail ring 1000 CPU-s or more (8 x 2 x 8191 steps on
    every rank): the two presets' 36 points at 1024 nodes are at least 5 CPU-hours here, so run them a column at
    a time (--nodes 1024 --algorithms ... --missing), one process (1-3 GB each)."""
    return SIZES


def jobs(quick=False, nodes_only=None, algorithms=ALGORITHMS, published=False):
    pts = [] if nodes_only and not published else [(t, n, nodes, "rail_ring", BIG) for _, t, n, ns, _, _ in PUBLISHED
                                                    for nodes in ns]
    for t, nics in TABLES:
        for nodes in nodes_only or (NODES[:2] if quick else NODES):
            for alg in algorithms:
                pts += [(t, nics, nodes, alg, s) for s in sizes_for(nodes, alg)]
    # the slow points first, so the pool's processes finish together; within a node count dgx-h100's
    # (the target) and the largest sizes first, so a sweep cut short has the rows that matter
    return sorted(pts, key=lambda p: (-p[2], p[0] != "dgx-h100", p[1] is not None, -p[4]))


def busbw(p) -> str:
    """A point's busbw as the tables write it: one decimal, two below 1 GB/s (flat rings at 1024 nodes)."""
    return f"{p['busbw_GBps']:.{1 if p['busbw_GBps'] >= 1 else 2}f}"


def target_lines(rows) -> list[str]:
    """Issue 39's target on dgx-h100: commlib's best (auto) at least NCCL's published 370 GB/s busbw
    from 64 MiB, at every simulated node count; and where the model's NCCL (rail_ring) leaves the
    published range, which is only published up to 16 nodes."""
    low = PUBLISHED[0][4]
    short = [(n, s, p["busbw_GBps"]) for (t, n, alg, s), p in sorted(rows.items())
             if t == "dgx-h100" and alg == "auto" and s >= 1 << 26 and p["busbw_GBps"] < low]
    out = [f"Target (dgx-h100, >= 64 MiB: auto >= NCCL's published {low:g} GB/s): "
           + ("met at every simulated point." if not short else "missed at " + ", ".join(
               f"{n} nodes {fmt_bytes(s)} ({b:.0f})" for n, s, b in short) + ".")]
    # The published A100 point's machine (4 NICs, two local ranks on each; docs/simulator.md "NIC-shared
    # hosts"): commlib's best against NCCL's published range itself, at every node count tabled.
    lo4, hi4 = PUBLISHED[1][4:]
    shared = [(n, s, p["busbw_GBps"]) for (t, n, alg, s), p in sorted(rows.items())
              if t == "dgx-a100-4nic" and alg == "auto" and s >= 1 << 26]
    if shared:
        under = [f"{n} nodes {fmt_bytes(s)} ({b:.1f})" for n, s, b in shared if b < hi4]
        out.append(f"NIC-shared hosts (dgx-a100-4nic, >= 64 MiB, {len(shared)} points at "
                   + ", ".join(sorted({str(n) for n, _, _ in shared}, key=int)) + " nodes): auto at or above NCCL's "
                   f"published {lo4:g}-{hi4:g} GB/s (3 nodes) " + ("at every one" if not under else
                   f"above {lo4:g} at every one, under {hi4:g} at " + ", ".join(under))
                   + f"; lowest {min(b for _, _, b in shared):.1f}, within "
                   + f"{max(1 - b / nic_floor('dgx-a100-4nic', 4, n) for n, _, b in shared) * 100:.1f} % of the "
                   "4-NIC wire floor at every one.")
    # Against the model's NCCL (rail_ring) on the same preset and size, where both were simulated:
    # the per-step and per-message costs the model charges NCCL's ring too (docs/simulator.md, "The
    # accounting").
    both = [(t, n, s, p["busbw_GBps"], rows[(t, n, "rail_ring", s)]["busbw_GBps"]) for (t, n, alg, s), p in sorted(rows.items())
            if alg == "auto" and s >= 1 << 26 and (t, n, "rail_ring", s) in rows]
    below = [f"{t} {n} nodes {fmt_bytes(s)} ({a:.0f} < {r:.0f})" for t, n, s, a, r in both if a < r]
    if both:
        out.append(f"auto against the model's NCCL (rail_ring), >= 64 MiB, {len(both)} points on the presets: "
                   + ("at least as fast at every one." if not below else "slower at " + ", ".join(below) + "."))
    def auto_picks(prefix):  # the points where auto resolved to an algorithm of this name
        return [f"{t} {n} nodes {fmt_bytes(s)}" for (t, n, alg, s), p in sorted(rows.items())
                if alg == "auto" and p["resolved"].startswith(prefix)]

    split = auto_picks("rail_split")
    out.append("rail_split (rail rings on a share of the buffer beside hierarchical on the rest) is among auto's "
               "candidates from 16 MiB in the points simulated since session 18 (the reruns dated 2026-11-29 07:40 "
               "and later): " + ("auto's pick at " + ", ".join(split) + "." if split else
                                 "auto's pick at none of them."))
    halving = auto_picks("rail_halving")
    out.append("rail_halving (hierarchical with halving and doubling inside the hosts and rabenseifner per rail, paired "
               "step by step by size; docs/simulator.md, 'Halving on every rail') is among auto's candidates in the points "
               "simulated since session 20 (the reruns dated 2026-11-29 13:34 and later): "
               + ("auto's pick at " + ", ".join(halving) + "." if halving else "auto's pick at none of them."))
    lanes = auto_picks("rail_lanes")
    out.append("rail_lanes (rail_halving on shares of the buffer, a lane each, each lane's steps waiting only for its "
               "own: slices in flight; docs/simulator.md, 'Slices in flight: lanes') is among auto's candidates in the "
               "points simulated since session 21 (the reruns dated 2026-11-29 16:30 and later): "
               + ("auto's pick at " + ", ".join(lanes) + "." if lanes else "auto's pick at none of them."))
    window = auto_picks("rail_window")
    out.append("rail_window (a lane per segment of rail_halving's plain form under a window of steps in flight; "
               "docs/simulator.md, 'A window of steps in flight') is among auto's candidates in the points simulated "
               "since session 25 (the reruns dated 2026-11-30 04:30 and later; from 4096 ranks below 512 MiB only): "
               + ("auto's pick at " + ", ".join(window) + "." if window else "auto's pick at none of them."))
    far = [(n, p["busbw_GBps"]) for (t, n, alg, s), p in sorted(rows.items())
           if t == "dgx-h100" and alg == "rail_ring" and s == BIG and n > 16]
    if far:
        out.append("The model's NCCL ring beyond the published node counts (1 GiB): " + ", ".join(
            f"{n} nodes {b:.0f} GB/s" for n, b in far) + " (each of a channel's 2(P-1) steps waits for "
            "the previous one whole, where NCCL pipelines slices within a step: 0.9 us of posting, latency and "
            "taking in a step, 1.8 ms at 128 nodes, beside the NICs' 5.5; docs/simulator.md, 'Session 17'; not "
            "checked against a published point at this scale).")
    for session, change, points, *alg in PREDICTIONS:  # alg: the column predicted (auto unless named)
        alg = alg[0] if alg else "auto"
        cells = []
        for t, n, size, was, predicted, *got in points:  # got: the result then, where a later change moved it
            p = rows.get((t, n, alg, size))
            cells.append(f"{t} {n} nodes {fmt_bytes(size)}: {was} before, predicted {predicted}, "
                         + (f"measured {got[0]}" if got else "the table " + (
                             busbw(p) + (f" ({p['resolved']})" if "(" in predicted else "") if p else "none")))
        out.append(f"Predicted before the rerun, beside the result in the table above ({alg}, busbw GB/s; session "
                   f"{session}: {change}): " + "; ".join(cells) + ".")
    out.append(AT_SCALE)
    return out + [""]


# What NCCL publishes beyond 16 nodes (issue 39, session 22): searched for in the stored public
# sources (NVIDIA's blogs and docs, nccl-tests and NCCL issues, cluster vendors' nccl-tests guides).
AT_SCALE = (
    "NCCL's number at 128 and 1024 nodes: no published nccl-tests all_reduce busbw for 64 MiB-1 GiB on 128 or 1024 "
    "DGX H100 nodes was found (searched session 22: NVIDIA's blogs and docs, the nccl-tests and NCCL issue trackers, "
    "cluster vendors' nccl-tests guides; NVIDIA/nccl issue 1211, 'How much can 512 H100 ReduceScatter/AllGather-8GB "
    "run to', asks exactly this for 1024-4096 H100 and has no answer; nccl-tests issue 196, S. Jeaugey: with 8 NICs "
    "NCCL's tree struggles to beat the ring, so the 370-385 plateau is the ring's). So 370 stays the mark at every "
    "node count and size here. The model's NCCL algorithms: the rail_ring column above (at 1024 nodes "
    "2 x 8191 lock-step steps a channel; its cells not simulated are listed below the tables), and NCCL's tree modelled as hierarchical with double_tree between hosts (one rail's tree "
    "per local rank; session 22: `_C.simulate(all_reduce, 'hierarchical', count, 4, 0, "
    "load('dgx-h100').engine_dict(nodes * 8), 'double_tree', segment)` at 1, 4 and 16 segments, 1 the fastest "
    "at each): 122.9 / 135.1 / 137.4 GB/s at 64 MiB / 256 MiB / 1 GiB on 128 nodes, 117.0 "
    "at 64 MiB on 1024 nodes; auto is faster at every one."
)


# Why a table's cell is "-" (the points `sizes_for` asks for that no run has filled), per node count.
UNRUN_WHY = {
    1024: "session 29 ran the 1024-node cells one at a time on the 2 shared cores, auto and ring first; session 33 "
          "and 34 ran rail_ring's (NCCL's), 760-1750 CPU-s and 2.2 GB a cell (below); a cell listed here was "
          "added or cleared since: `bench/sim_rails.py --jobs 1 --nodes 1024 --missing`",
}
# What the 1024-node points cost (sessions 29-34, measured here).
SCALE_COST = (
    "What a 1024-node point costs here (CPU seconds of one process): ring 64-89 (134 M steps: 2 x 8191 on each of "
    "8192 ranks; session 29, load 2-7); auto 73-80 at 1 MiB, 231 / 352 at 4 / 16 MiB on dgx-h100 (0.2-1.0 GB), 651 at "
    "256 MiB on dgx-a100 (1.2 GB); rail_ring, 8 channels of the ring's steps (1.07 G), 760-1150 a cell alone on a "
    "core (sessions 33-34: dgx-a100 at 1 MiB-1 GiB, dgx-h100 at 1, 4, 64 and 256 MiB), about 1750 at dgx-h100's 16 MiB "
    "and 1 GiB (sharing the cores with other runs), 2.2 GB (docs/simulator.md, 'Scale: compaction', says why compaction does not shrink it "
    "and what could).")


def markdown(data) -> list[str]:
    rows = {(p["topology"], p["nodes"], p["algorithm"], p["bytes"]): p for p in data["points"]}
    out = ["NCCL's algorithm for large all_reduce across nodes is one ring per rail (multi-channel, each "
           "channel crossing nodes through a different GPU and NIC); `rail_ring` is that schedule, so its "
           "prediction is the model's prediction for NCCL. Published nccl-tests points against it (1 GiB):", "",
           "| machine | nodes | published busbw (GB/s) | model, rail_ring (GB/s) | off the range |", "|---|---|---|---|---|"]
    worst = 0.0
    for label, t, nics, ns, lo, hi in PUBLISHED:
        name = _topology(t, nics).name
        for nodes in ns:
            b = rows[(name, nodes, "rail_ring", BIG)]["busbw_GBps"]
            off = 0.0 if lo <= b <= hi else (b / hi - 1 if b > hi else b / lo - 1)
            worst = max(worst, abs(off))
            out.append(f"| {label} (`{name}`) | {nodes} | {lo:g}-{hi:g} | {b:.1f} | {off * 100:+.1f}% |")
    out += ["", f"Largest deviation from a published range: {worst * 100:.1f}% (target: within 15%).", ""]
    for preset, nics in TABLES:
        t = _topology(preset, nics).name
        for nodes in NODES:
            if not any(k[:2] == (t, nodes) for k in rows):
                continue
            out += [f"**{t}, {nodes} nodes ({nodes * 8} ranks)**: all_reduce busbw (GB/s); NCCL's published "
                    + ("370-385" if t == "dgx-h100" else "85-96 (3 nodes; two GPUs a NIC)" if nics else
                       "no published point for 8 NICs (4 NICs: 85-96)")
                    + (f"; the wire floor of a bandwidth-optimal hierarchical all_reduce {nic_floor(t, nics, nodes):.1f}"
                       if nics else ""), "",
                    "| size | ring | rail_ring (NCCL's) | auto (commlib's best) | auto picks |", "|---|---|---|---|---|"]
            for s in SIZES:
                cells = []
                for alg in ALGORITHMS:
                    p = rows.get((t, nodes, alg, s))
                    cells.append(busbw(p) if p else "-")
                a = rows.get((t, nodes, "auto", s))
                out.append(f"| {fmt_bytes(s)} | " + " | ".join(cells) + f" | {a['resolved'] if a else '-'} |")
            out.append("")
    out += target_lines(rows)
    missing = [n for n in NODES if not any(p["nodes"] == n for p in data["points"])]
    if missing:
        out.append(f"Not in this sweep: {', '.join(map(str, missing))} nodes (not run: `--quick` or `--nodes` left them out).")
    shown = {k[:2] for k in rows}
    unrun = {}  # (topology, nodes, algorithm): the sizes of a table shown above that no run has filled
    for preset, nics in TABLES:
        t = _topology(preset, nics).name
        for nodes in NODES:
            for alg in ALGORITHMS:
                sizes = [s for s in sizes_for(nodes, alg) if (t, nodes) in shown and (t, nodes, alg, s) not in rows]
                if sizes:
                    unrun[(t, nodes, alg)] = sizes
    for nodes in sorted({n for _, n, _ in unrun}):
        out.append(f"Not simulated (\"-\" above), {nodes} nodes: " + "; ".join(
            f"{t} {alg} at {', '.join(fmt_bytes(s) for s in sizes)}" for (t, n, alg), sizes in unrun.items() if n == nodes)
            + f" ({UNRUN_WHY.get(nodes, 'not run yet')}).")
    slow = max(data["points"], key=lambda p: p["wall_s"])
    out.append(f"Slowest point: {slow['topology']} {slow['nodes']} nodes {slow['algorithm']} {fmt_bytes(slow['bytes'])}, "
               f"{slow['wall_s']:.0f} s. " + SCALE_COST)
    out.append(f"Sweep: {data['jobs']} processes, {data['wall_s']:.0f} s on this shared 2-core VM (the runs' wall times added up).")
    commits = {}
    for p in data["points"]:
        commits[p.get("commit", "")] = commits.get(p.get("commit", ""), 0) + 1
    out.append("Points by the commit they were simulated at (recorded since session 34; a model change after a point's "
               "run leaves it stale until rerun): " + "; ".join(
                   f"{c or 'not recorded'}: {n}" for c, n in sorted(commits.items(), key=lambda kv: -kv[1])) + ".")
    for run in data.get("runs", []):
        out.append(f"Rerun {run['date']}: {run['nodes']} nodes, {run['algorithms']} ({run['points']} points), "
                   f"{run['wall_s']:.0f} s on {run['jobs']} processes (nice {run['nice']}), load average "
                   f"{run['load_start']:.1f} at the start and {run['load_end']:.1f} at the end (other sessions' work "
                   "on the same 2 cores).")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 and 16 nodes only")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "sim_data", "rails.json"))
    ap.add_argument("--nodes", default="", help="comma list of node counts to simulate, merged into --json")
    ap.add_argument("--published", action="store_true", help="with --nodes: the published points' rail_ring too")
    ap.add_argument("--missing", action="store_true", help="with --nodes: only the points --json does not hold")
    ap.add_argument("--topologies", default="",
                    help="with --nodes: comma list of the tables' machines (dgx-h100, dgx-a100, dgx-a100-4nic) to simulate")
    ap.add_argument("--sizes", default="", help="with --nodes: comma list of sizes in MiB to simulate (e.g. 64,1024)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS),
                    help="with --nodes: comma list of the algorithms to simulate (e.g. auto), merged into --json")
    a = ap.parse_args(argv)
    nodes_only = tuple(int(n) for n in a.nodes.split(",")) if a.nodes else None
    if nodes_only and not set(nodes_only) <= set(NODES):
        ap.error(f"--nodes: expected some of {NODES}, got {a.nodes!r}")
    algorithms = tuple(a.algorithms.split(","))
    if not set(algorithms) <= set(ALGORITHMS) or (algorithms != ALGORITHMS and not nodes_only):
        ap.error(f"--algorithms: some of {ALGORITHMS}, with --nodes; got {a.algorithms!r}")
    todo = list(dict.fromkeys(jobs(a.quick, nodes_only, algorithms, a.published)))
    if (a.topologies or a.sizes) and not nodes_only:
        ap.error("--topologies, --sizes: with --nodes")
    if a.topologies:  # one point at a time at 1024 nodes (15-20 min and ~3 GB each)
        todo = [j for j in todo if _topology(j[0], j[1]).name in a.topologies.split(",")]
    if a.sizes:
        todo = [j for j in todo if j[4] in {int(s) << 20 for s in a.sizes.split(",")}]
    load_start = os.getloadavg()[0]
    if a.missing and nodes_only and os.path.exists(a.json):
        with open(a.json) as f:
            held = {(p["topology"], p["nodes"], p["algorithm"], p["bytes"]) for p in json.load(f)["points"]}
        todo = [j for j in todo if (_topology(j[0], j[1]).name, j[2], j[3], j[4]) not in held]
    t0 = time.perf_counter()
    old = None
    if nodes_only and os.path.exists(a.json):
        with open(a.json) as f:
            old = json.load(f)
    points = []

    def save():  # after every point (--nodes merges), so a sweep cut short keeps what it finished
        data = {"points": points, "jobs": a.jobs, "wall_s": time.perf_counter() - t0}
        if old is not None:
            key = lambda p: (p["topology"], p["nodes"], p["algorithm"], p["bytes"])  # noqa: E731
            new = {key(p) for p in points}
            data["points"] = [p for p in old["points"] if key(p) not in new] + points
            data["wall_s"] += old.get("wall_s", 0.0)
            data["runs"] = old.get("runs", []) + [{
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "nodes": a.nodes,
                "algorithms": a.algorithms, "points": f"{len(points)} of {len(todo)}", "jobs": a.jobs,
                "nice": os.nice(0), "wall_s": time.perf_counter() - t0, "load_start": load_start,
                "load_end": os.getloadavg()[0]}]
        with open(a.json, "w") as f:
            json.dump(data, f, indent=0)
            f.write("\n")
        return data

    data = save() if not todo else None
    with ProcessPoolExecutor(a.jobs) as ex:
        for done in as_completed([ex.submit(_point, j) for j in todo]):
            points.append(done.result())
            data = save()
    print("\n".join(markdown(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
