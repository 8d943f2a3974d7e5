"""Acceptance of auto at scale in the simulator (issue #24), written to bench/sim_data/scale.json and
as markdown for bench/RESULTS_sim.md.

For every (topology, hosts, collective, size): every candidate auto's cost model ranks (flat
algorithms, and hierarchical with each inter-host algorithm: policy/auto_policy.h
predict_candidates) is simulated, and auto's own choice is taken from the engine's one resolution
(resolve_algorithm, the function communicators call). Checked: auto within 10 % of the best
registered algorithm; where auto picks hierarchical, it is within 10 % of the best flat one; and what
auto picked before the cost model (link-kind rule, built-in heuristic), predicted alike. This
machine's measured tuning table is cleared first (it describes this machine, not the simulated
cluster; a communicator's table still wins over the model where it has the shape). Also
timed: one 4096-rank prediction (ring all_reduce, dgx-h100, 512 hosts).

Sizes are the collective's buffer per rank as nccl-tests counts them (all_reduce and broadcast:
count x 4 B; all_gather: the output; reduce_scatter: the input), float32.

    python bench/sim_scale.py [--quick] [--jobs N] [--json out.json] [--md out.md]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from commlib.sim import ranking
from commlib import _C
from commlib.core import call_spec
from commlib.sim import topology as sim_topology

TOPOLOGIES = ("dgx-h100", "eth-25g")
HOSTS = (2, 4, 8, 16, 32, 64, 128)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SIZES = tuple(1 << k for k in range(10, 31, 4))  # 1 KiB .. 1 GiB, x16
TOLERANCE = 0.10


def count_for(coll: str, size: int, ranks: int) -> int:
    elems = max(size // 4, 1)
    return max(elems // ranks, 1) if coll in ("all_gather", "reduce_scatter") else elems


def label(c: dict) -> str:
    return "/".join([c["algorithm"]] + [c[k] for k in ("inter_algorithm", "intra_algorithm") if c.get(k)])


def point(args):
    topo_name, hosts, coll, size = args
    # The tuning table installed on import was measured on this machine (shared memory, 2-8 ranks):
    # it says nothing about the simulated cluster, so auto here is the cost model's alone.
    _C.clear_tuning()
    topo = sim_topology.load(topo_name)
    ranks = hosts * topo.devices_per_host
    d = topo.engine_dict(ranks)
    count = count_for(coll, size, ranks)
    t0 = time.perf_counter()
    choice = _C.resolve_algorithm(call_spec.collective(coll), "auto", count, 4, 0, ranks, d["host_of"], d)
    cands = choice["candidates"]  # what the cost model ranked (every candidate: predict_candidates)
    assert choice["source"] == "model" and cands, choice
    wall = time.perf_counter() - t0
    best = ranking.tie_pick(cands)
    flat = [c for c in cands if c["algorithm"] != "hierarchical"]
    best_flat = ranking.tie_pick(flat)
    auto_t = next(c["predicted_s"] for c in cands
                  if label(c) == label(choice))
    # Before the cost model: the link-kind rule and the built-in heuristic (no model given).
    before = _C.resolve_algorithm(call_spec.collective(coll), "auto", count, 4, 0, ranks, d["host_of"])
    before_t = next(c["predicted_s"] for c in cands if c["algorithm"] == before["algorithm"] and not c["inter_algorithm"])
    return {"topology": topo_name, "hosts": hosts, "ranks": ranks, "collective": coll, "bytes": size,
            "auto": label(choice), "auto_source": choice["source"], "auto_s": auto_t, "best": label(best),
            "best_s": best["predicted_s"], "best_flat": label(best_flat), "best_flat_s": best_flat["predicted_s"],
            "before": before["algorithm"], "before_s": before_t, "candidates": len(cands), "wall_s": wall}


def time_4096() -> dict:
    topo = sim_topology.load("dgx-h100")
    d = topo.engine_dict(4096)
    t0 = time.perf_counter()
    r = _C.simulate(_C.Collective.all_reduce, "ring", (1 << 30) // 4, 4, 0, d)
    return {"ranks": 4096, "algorithm": "ring", "bytes": 1 << 30, "predicted_s": r["time_s"],
            "wall_s": time.perf_counter() - t0}


def fmt_size(b: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b >> k} {unit}"
    return f"{b} B"


def markdown(rows, t4096, wall_total, jobs) -> str:
    has_before = any("before_s" in r for r in rows)  # older sweeps did not record it
    out = ["| topology | collective | hosts | worst auto / best | where |" + (" before: worst / best |" if has_before else "")
           + " auto's picks (sizes 1 KiB..1 GiB, x16) |",
           "| --- | --- | --- | --- | --- |" + (" --- |" if has_before else "") + " --- |"]
    groups = {}
    for r in rows:
        groups.setdefault((r["topology"], r["collective"], r["hosts"]), []).append(r)
    for (topo, coll, hosts), rs in sorted(groups.items(), key=lambda kv: (TOPOLOGIES.index(kv[0][0]), COLLECTIVES.index(kv[0][1]), kv[0][2])):
        rs.sort(key=lambda r: r["bytes"])
        worst = max(rs, key=lambda r: r["auto_s"] / r["best_s"])
        picks = []
        for r in rs:
            if not picks or picks[-1][0] != r["auto"]:
                picks.append([r["auto"], r["bytes"], r["bytes"]])
            else:
                picks[-1][2] = r["bytes"]
        pick_s = ", ".join(f"{a} {fmt_size(lo)}" + (f"-{fmt_size(hi)}" if hi != lo else "") for a, lo, hi in picks)
        was = max(rs, key=lambda r: r.get("before_s", r["auto_s"]) / r["best_s"])
        was_s = (f"{was['before_s'] / was['best_s']:.2f} ({was['before']}, {fmt_size(was['bytes'])})"
                 if "before_s" in was else "-")
        out.append(f"| {topo} | {coll} | {hosts} | {worst['auto_s'] / worst['best_s']:.3f} | "
                   f"{fmt_size(worst['bytes'])} |" + (f" {was_s} |" if has_before else "") + f" {pick_s} |")
    bad = [r for r in rows if r["auto_s"] > (1 + TOLERANCE) * r["best_s"]]
    hier = [r for r in rows if r["auto"].startswith("hierarchical")]
    hier_bad = [r for r in hier if r["auto_s"] > (1 + TOLERANCE) * r["best_flat_s"]]
    worst_hier = max((r["auto_s"] / r["best_flat_s"] for r in hier), default=float("nan"))
    before_bad = [r for r in rows if r.get("before_s", 0) > (1 + TOLERANCE) * r["best_s"]]
    out += ["", f"Points: {len(rows)}; auto more than 10 % slower than the best candidate at {len(bad)} "
            + (f"(before the cost model, with the link-kind rule and the heuristic: at {len(before_bad)})" if has_before
               else "") + "; "
            f"auto picked hierarchical at {len(hier)}, more than 10 % slower than the best flat one at "
            f"{len(hier_bad)} (worst ratio to the best flat {worst_hier:.3f}). "
            f"4096 ranks (ring all_reduce, 1 GiB, dgx-h100): predicted {t4096['predicted_s'] * 1e3:.2f} ms in "
            f"{t4096['wall_s']:.1f} s wall. Sweep: {wall_total:.0f} s wall on {jobs} processes."]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 and 8 hosts, 3 sizes (seconds)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    a = ap.parse_args(argv)
    hosts, sizes = ((2, 8), (1 << 10, 1 << 20, 1 << 30)) if a.quick else (HOSTS, SIZES)
    pts = [(t, h, c, s) for t in TOPOLOGIES for h in hosts for c in COLLECTIVES for s in sizes]
    pts.sort(key=lambda p: -p[1])  # the large ones first: better packing
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        rows = list(ex.map(point, pts, chunksize=1))
    wall = time.perf_counter() - t0
    t4096 = time_4096()
    md = markdown(rows, t4096, wall, a.jobs)
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "t4096": t4096, "wall_s": wall, "jobs": a.jobs}, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")
    bad = [r for r in rows if r["auto_s"] > (1 + TOLERANCE) * r["best_s"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
