"""The overlapped hierarchical all_reduce in the model (issue #39, item 2): on equal DGX hosts each
composition's time, at the segments and pieces the cost model chooses, against the slower of its
two phases, the plain (one-segment) schedule and the fixed rule's shape. Written to bench/sim_data/overlap.json and, through bench/sim_validate.py, to
bench/RESULTS_sim.md section (h).

A phase alone is the same schedule on the same preset with the other kind of link made 1000x faster
(its latency, and for the intra-host links the reductions, free): `intra` is the schedule's time
with a near-free network, `inter` with near-free NVLink. The overlapped pipeline should approach
max(intra, inter); the plain schedule runs them one after another (about their sum).

    python bench/sim_overlap.py [--jobs N] [--json bench/sim_data/overlap.json] [--nodes 2,16]
        [--sizes 64,1024] [--compositions two_shot/-]

`--nodes`, `--sizes` and `--compositions` simulate those points only and merge them into the JSON
file's (a point simulated again replaces its old value).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from commlib import _C  # noqa: E402
from commlib import sim  # noqa: E402
from commlib.perf.common import fmt_bytes  # noqa: E402

PRESETS = ("dgx-h100", "dgx-a100")
NODES = (2, 16, 128)
SIZES = (64 << 20, 256 << 20, 1 << 30)
# (inter, intra): the built-in exchange, the compositions auto ranks best at these sizes, and one
# with a registered algorithm inside the hosts.
COMPOSITIONS = (("", ""), ("two_shot", ""), ("rabenseifner", ""), ("two_shot", "ring"))
PLAIN = 1 << 40  # a segment longer than any message: one segment, no pipeline


def _time(preset, nodes, size, inter, intra, segment=-1, fast=None, pieces=0):
    return sim.engine.hierarchical_time(preset, nodes, size, inter, intra, segment, fast or "", pieces)


def _point(args):
    preset, nodes, size, inter, intra = args
    _C.clear_tuning()
    t0 = time.perf_counter()
    # The shape the cost model's policy chooses (policy/pipeline_shape.h), as auto's candidate runs it;
    # the phases alone at that shape; the fixed rule's shape (COMMLIB_HIER_SEGMENT, 8 pieces) beside.
    segment, pieces = sim.engine.pipeline_shape(preset, nodes, size, inter, intra)
    shaped = {"segment": segment, "pieces": pieces}
    out = {"topology": preset, "nodes": nodes, "bytes": size, "inter": inter, "intra": intra,
           "segments": size // 4 // segment if segment else 1, "pieces": pieces,
           "overlapped_s": _time(preset, nodes, size, inter, intra, **shaped),
           "rule_s": _time(preset, nodes, size, inter, intra),
           "plain_s": _time(preset, nodes, size, inter, intra, PLAIN),
           "intra_s": _time(preset, nodes, size, inter, intra, fast="nic", **shaped),
           "inter_s": _time(preset, nodes, size, inter, intra, fast="intra", **shaped)}
    out["wall_s"] = time.perf_counter() - t0
    return out


def points(nodes, sizes=SIZES, compositions=COMPOSITIONS):
    # The built-in exchange sends each block to every other host: hopeless from 16 nodes, skipped there.
    return [(p, n, s, x, i) for p in PRESETS for n in nodes for s in sizes for x, i in compositions
            if not (x == "" and n > 2)]


def markdown(data) -> list:
    lines = ["All_reduce, hierarchical with each composition (`inter/intra`, `-` the built-in phase), on "
             "equal hosts: the overlapped pipeline at the shape the cost model chooses (`K/p`: segments and "
             "the most pieces per lane segment, policy/pipeline_shape.h; K 1 is the plain schedule) against "
             "the plain one-segment schedule, the fixed rule's shape (`COMMLIB_HIER_SEGMENT` 256 Ki elements, "
             "at most 16 segments, 8 pieces) and each phase alone at the chosen shape (the other kind of link "
             "1000x faster). `vs slower` is overlapped / max(intra, inter): 1.00 is the bound "
             "(docs/simulator.md, \"Pipelined hierarchical all_reduce\").", "",
             "| preset | nodes | size | composition | intra alone (ms) | inter alone (ms) | plain (ms) | "
             "rule's shape (ms) | K/p | overlapped (ms) | vs slower | busbw plain -> overlapped (GB/s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(data["points"], key=lambda r: (r["topology"], r["nodes"], r["bytes"], r["inter"], r["intra"])):
        ranks = r["nodes"] * 8  # both presets: 8 GPUs a node
        factor = 2 * (ranks - 1) / ranks * r["bytes"] / 1e9
        name = f"{r['inter'] or '-'}/{r['intra'] or '-'}"
        slower = max(r["intra_s"], r["inter_s"])
        shape = f"{r['segments']}/{r['pieces']}" if "segments" in r else "16/8"
        rule = f"{r['rule_s'] * 1e3:.2f}" if "rule_s" in r else "-"
        lines.append(f"| {r['topology']} | {r['nodes']} | {fmt_bytes(r['bytes'])} | {name} | {r['intra_s'] * 1e3:.2f} | "
                     f"{r['inter_s'] * 1e3:.2f} | {r['plain_s'] * 1e3:.2f} | {rule} | {shape} | "
                     f"{r['overlapped_s'] * 1e3:.2f} | {r['overlapped_s'] / slower:.2f} | "
                     f"{factor / r['plain_s']:.0f} -> {factor / r['overlapped_s']:.0f} |")
    lines += [""] + data.get("notes", [])
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "sim_data", "overlap.json"))
    ap.add_argument("--nodes", default=",".join(map(str, NODES)))
    ap.add_argument("--sizes", default="", help="comma list of sizes in MiB (default: 64,256,1024)")
    ap.add_argument("--compositions", default="", help="comma list of inter/intra (- for built-in), e.g. two_shot/-")
    a = ap.parse_args(argv)
    nodes = tuple(int(n) for n in a.nodes.split(","))
    sizes = tuple(int(m) << 20 for m in a.sizes.split(",")) if a.sizes else SIZES
    comps = tuple(tuple("" if p == "-" else p for p in c.split("/")) for c in a.compositions.split(",")) \
        if a.compositions else COMPOSITIONS
    old = {"points": [], "notes": []}
    if os.path.exists(a.json):
        with open(a.json) as f:
            old = json.load(f)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as ex:
        new = list(ex.map(_point, points(nodes, sizes, comps)))
    slowest = max(new, key=lambda r: r["wall_s"])
    note = (f"Sweep of {','.join(map(str, nodes))} nodes: {time.perf_counter() - t0:.0f} s on {a.jobs} processes "
            f"(a shared 2-core VM); slowest point {slowest['topology']} {slowest['nodes']} nodes "
            f"{slowest['inter'] or '-'}/{slowest['intra'] or '-'} {fmt_bytes(slowest['bytes'])}, {slowest['wall_s']:.0f} s "
            "for its four runs.")
    fresh = {(r["topology"], r["nodes"], r["bytes"], r["inter"], r["intra"]) for r in new}
    data = {"points": [r for r in old["points"] if (r["topology"], r["nodes"], r["bytes"], r["inter"], r["intra"]) not in fresh] + new,
            "notes": [n for n in old.get("notes", []) if not n.startswith(f"Sweep of {','.join(map(str, nodes))} ")] + [note]}
    with open(a.json, "w") as f:
        json.dump(data, f, indent=1)
    print("\n".join(markdown(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
