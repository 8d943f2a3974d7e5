"""``commlib tune --sim TOPOLOGY``: auto's tuning file for a cluster that cannot be measured here.

Every registered algorithm of each collective is simulated per (world size, size); the pick per
size is the fastest prediction, smoothed like measured tuning (perf/tuning_path.py: within 10%
of the best, few switches). The file has the format ``commlib tune`` writes, rows marked
``"source": "sim:<topology>"``; load it with ``COMMLIB_TUNING=<file>`` on that cluster.
"""
from __future__ import annotations

import sys

from commlib.perf import common as C

__all__ = ["add_arguments", "main", "table_for"]

TUNED = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def add_arguments(t):
    t.add_argument("--sim", metavar="TOPOLOGY",
                   help="tune from simulator predictions for TOPOLOGY (preset, JSON file or fitted:<bench.json>) "
                        "instead of bench files")
    t.add_argument("--nodes", help="with --sim: comma list of host counts (default 1,2,4,8)")
    t.add_argument("--np", dest="np_", help="with --sim: comma list of rank counts (instead of --nodes)")
    t.add_argument("--collectives", default=",".join(TUNED), help="with --sim: collectives to tune")
    t.add_argument("-b", "--minbytes", default="8", help="with --sim: smallest size")
    t.add_argument("-e", "--maxbytes", default="256M", help="with --sim: largest size")
    t.add_argument("-f", "--stepfactor", type=float, default=4.0, help="with --sim: size factor")


def table_for(topology, ranks_list, sizes, collectives=TUNED, dtype="float32") -> dict:
    """The tuning table (commlib/core/tuning.py's format) from predictions."""
    from commlib.core import schedules
    from commlib.core.tuning import SCHEMA
    from commlib.perf.tuning_path import choose_path, rows
    from commlib.sim import engine
    from commlib.sim.topology import load
    topo = load(topology)
    colls = {}
    for coll in collectives:
        # What communicators run: a one-sided schedule must never become auto's choice on the host.
        algs = schedules.algorithms(coll)
        for P in ranks_list:
            if P < 2:
                continue
            times, cores = [], []
            for size in sizes:
                recs = [engine.predict(coll, a, size, P, topo, dtype) for a in algs]
                times.append({r["algorithm"]: r["time_us"]["median"] for r in recs})
                cores.append(C.core_bytes(coll, size, dtype, P))
            colls.setdefault(coll, {})[str(P)] = {"source": f"sim:{topo.name}", "dtype": dtype,
                                                 "hosts": -(-P // topo.devices_per_host),  # filled host by host
                                                 "rows": rows(cores, choose_path(times))}
    return {"schema": SCHEMA, "bytes": "per-rank count x element size, as _C.choose_algorithm sees it",
            "topology": topo.as_json(), "collectives": colls}


def main(args) -> int:
    from commlib.core.tuning import write
    from commlib.sim.cli import parse_ranks
    from commlib.sim.topology import TopologyError, load
    if args.files:
        print("commlib tune: give bench JSON files or --sim, not both", file=sys.stderr)
        return 2
    if not args.output:
        print("commlib tune --sim: -o FILE is required (a simulated cluster's tuning must not replace "
              "this machine's commlib/core/tuning.json)", file=sys.stderr)
        return 2
    try:
        topo = load(args.sim)
    except TopologyError as e:
        print(f"commlib tune: {e}", file=sys.stderr)
        return 2
    if not args.nodes and not args.np_:
        args.nodes = "1,2,4,8"
    ranks = parse_ranks(args, topo)
    sizes = C.size_list(C.parse_size(args.minbytes), C.parse_size(args.maxbytes), args.stepfactor)
    colls = [c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in colls if c not in TUNED]
    if bad:
        print(f"commlib tune: --collectives: cannot tune {', '.join(bad)} (expected {', '.join(TUNED)})",
              file=sys.stderr)
        return 2
    table = table_for(topo, ranks, sizes, colls)
    write(args.output, table)
    print(f"# tuning for {topo.name} written to {args.output}: world sizes {ranks}, "
          f"{len(sizes)} sizes, collectives {', '.join(colls)}")
    return 0
