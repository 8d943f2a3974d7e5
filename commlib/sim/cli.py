"""``commlib sim``: predicted nccl-tests tables for modelled clusters.

    commlib sim all_reduce --algorithm ring,rabenseifner,auto --topology dgx-h100 \
        --nodes 1,2,8,64,512 -b 8 -e 1G -f 4 --json sim.json
    commlib sim all_to_all --topology topo.json --np 96
    commlib sim all_reduce --topology fitted:report/bench.json --np 2
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from commlib.perf import common as C
from commlib.perf.table import Table

__all__ = ["add_arguments", "run", "parse_ranks"]


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("collectives", nargs="+", metavar="COLL", help="collective(s) to predict")
    p.add_argument("--algorithm", "--algorithms", dest="algorithm", default="all",
                   help="comma list of algorithms, 'auto', or 'all' (every registered one); "
                        "hierarchical/<inter>[/<intra>] names hierarchical's inter- and intra-host algorithms "
                        "(rail_split/<inter>[/<intra>] those of rail_split's hierarchical part)")
    p.add_argument("--topology", required=True,
                   help="a preset (dgx-h100, dgx-a100, eth-25g, eth-100g), a topology JSON file, "
                        "or fitted:<bench.json> (this machine, from a commlib bench --json run)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--nodes", help="comma list of host counts (ranks = hosts x devices per host)")
    g.add_argument("--np", dest="np_", help="comma list of rank counts")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size")
    p.add_argument("-e", "--maxbytes", default="1G", help="largest size, always included")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0, help="size factor")
    p.add_argument("-d", "--datatype", default="float32", choices=C.DTYPES)
    p.add_argument("-r", "--root", type=int, default=0, help="root of rooted collectives")
    p.add_argument("--json", metavar="FILE", help="write the records here (commlib report reads them)")


def _int_list(text: str, what: str) -> list:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"commlib sim: {what}: expected a comma list of integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise SystemExit(f"commlib sim: {what}: expected integers >= 1, got {text!r}")
    return vals


def parse_ranks(args, topo) -> list:
    if args.np_:
        return _int_list(args.np_, "--np")
    if args.nodes:
        return [n * topo.devices_per_host for n in _int_list(args.nodes, "--nodes")]
    return [topo.devices_per_host]


def run(args) -> int:
    from commlib.sim import engine
    from commlib.sim.topology import TopologyError, load
    try:
        topo = load(args.topology)
    except TopologyError as e:
        print(f"commlib sim: {e}", file=sys.stderr)
        return 2
    ranks = parse_ranks(args, topo)
    sizes = C.size_list(C.parse_size(args.minbytes), C.parse_size(args.maxbytes), args.stepfactor)
    print(f"# commlib sim: {topo.describe()}")
    records = []
    for coll in args.collectives:
        try:
            algs = engine.algorithms_for(coll, args.algorithm)
        except ValueError as e:
            print(f"commlib sim: {e}", file=sys.stderr)
            return 2
        for P in ranks:
            table = Table(coll, P, out=sys.stdout, modes=("out",))
            table.header(f"{coll} (predicted), {P} ranks = {-(-P // topo.devices_per_host)} host(s) of {topo.name}")
            for size in sizes:
                for alg in algs:
                    try:
                        rec = engine.predict(coll, alg, size, P, topo, args.datatype, args.root)
                    except ValueError as e:
                        print(f"commlib sim: {e}", file=sys.stderr)
                        return 2
                    records.append(rec)
                    resolved = engine.phases_label(rec["resolved"], rec.get("inter_algorithm", ""),
                                                   rec.get("intra_algorithm", ""))
                    label = alg if resolved == alg else f"{alg}>{resolved}"
                    table.row(rec["bytes"], rec["count"], args.datatype, "sum" if coll in C.REDUCING else "none",
                              rec["root"], {"out": rec}, algorithm=label)
            table.footer()
    if args.json:
        d = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(d, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"schema": engine.SCHEMA, "kind": "sim", "command": "commlib " + " ".join(sys.argv[1:]),
                       "topology": topo.as_json(), "results": records}, f, indent=1)
        print(f"# wrote {args.json}", file=sys.stderr)
    return 0
