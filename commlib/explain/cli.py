"""``commlib explain``: the schedule explorer page of one collective.

    commlib explain all_reduce ring --size 4 --count 8 -o explain/
    commlib explain broadcast pipeline --size 6 --count 256 --topology eth-25g -o explain/
    commlib explain all_reduce hierarchical --size 8 --count 16 --topology dgx-h100 --nodes 2 -o explain/

writes ``DIR/<collective>.html``, opening at ALGORITHM with P ranks and N elements; the page
carries every algorithm of the collective (or --algorithms) at --sizes and --counts.
"""
from __future__ import annotations

import argparse
import os

__all__ = ["add_arguments", "run", "parse_int_list"]


def parse_int_list(text: str, what: str) -> list:
    """"2-8,12" -> [2, 3, ..., 8, 12]; a ValueError naming ``what`` otherwise."""
    out = []
    try:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise ValueError(f"{what}: expected numbers and ranges like 2-8,12, got {text!r}") from None
    if not out:
        raise ValueError(f"{what}: empty")
    return out


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("collective", help="all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, "
                                      "gather, scatter or barrier")
    p.add_argument("algorithm", help="the registered algorithm the page opens at")
    p.add_argument("--size", "-P", type=int, default=4, help="ranks the page opens at (2..16, default 4)")
    p.add_argument("--count", "-n", type=int, default=8, help="elements the page opens at (default 8; per rank "
                                                              "block for all_gather and all_to_all)")
    p.add_argument("--topology", default="dgx-h100", help="the simulator's topology: a preset (dgx-h100, dgx-a100, "
                                                          "eth-25g, eth-100g) or a topology JSON file")
    p.add_argument("--nodes", type=int, help="hosts the ranks are spread over (default: the topology's devices "
                                             "per host fill each host)")
    p.add_argument("--sizes", default="2-8", help="the other rank counts the page carries (default 2-8)")
    p.add_argument("--counts", help="the counts the page carries (default: 1, N and 16 N)")
    p.add_argument("--algorithms", help="comma list of the algorithms the page carries (default: every one)")
    p.add_argument("--root", type=int, default=0, help="root of rooted collectives (default 0)")
    p.add_argument("--bytes-per-element", dest="elem_bytes", type=int, default=4,
                   help="bytes of one element for the simulator (default 4, float32; larger: see bandwidth)")
    p.add_argument("-o", "--output", default="explain", help="folder of the page (default explain/)")


def run(args) -> int:
    from commlib.explain import write_page
    sizes = parse_int_list(args.sizes, "--sizes")
    counts = parse_int_list(args.counts, "--counts") if args.counts else None
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()] if args.algorithms else None
    path = os.path.join(args.output, f"{args.collective}.html")
    write_page(args.collective, args.algorithm, args.size, args.count, path, topology=args.topology,
               nodes=args.nodes, sizes=sizes, counts=counts, algorithms=algorithms, root=args.root,
               elem_bytes=args.elem_bytes)
    print(f"explain: {path}#alg={args.algorithm}&P={args.size}&count={args.count} "
          f"(open it in a browser; it needs no server)")
    return 0
