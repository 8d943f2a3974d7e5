"""``commlib bench-torch``: what a blocking all_reduce costs through torch.distributed.

    commlib bench-torch --np 2 -b 8 -e 64K [--json FILE]

Every rank process measures, in the same processes and interleaved in rounds, the median time per
blocking all_reduce of each size for:

* ``comm.all_reduce`` on a NumPy array and on a torch CPU tensor (the commlib core, no torch.distributed);
* ``dist.all_reduce`` over the "commlib" process group, and over a gloo group of the same ranks;
* ``dist.all_reduce`` over a do-nothing backend ("noop": returns a completed work at once), the
  floor torch's own dispatch costs before any backend runs.

Rank 0 prints a Markdown table (µs, medians of the per-round medians) with the ratios
commlib/noop and commlib/comm.all_reduce(torch).
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import time

KINDS = ("comm_numpy", "comm_torch", "dist_commlib", "dist_gloo", "dist_noop")


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("--np", type=int, default=2, dest="np_", help="ranks (default 2)")
    p.add_argument("-b", "--minbytes", type=int, default=8, help="smallest size in bytes (default 8)")
    p.add_argument("-e", "--maxbytes", type=int, default=65536, help="largest size (default 65536)")
    p.add_argument("-f", "--stepfactor", type=int, default=8, help="size factor (default 8)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--calls", type=int, default=300, help="calls per kind, size and round (default 300)")
    p.add_argument("--json", metavar="FILE", help="write the medians here")


def _noop_backend():
    import torch
    import torch.distributed as dist
    from torch.futures import Future

    class Noop(dist.ProcessGroup):
        def __init__(self, rank, size):
            super().__init__(rank, size)
            fut = Future()
            fut.set_result(None)
            self._work = torch._C._distributed_c10d._create_work_from_future(fut)

        def getBackendName(self):
            return "noop"

        def allreduce(self, tensors, opts=None):
            return self._work

    if "NOOP" not in dist.Backend._plugins:
        dist.Backend.register_backend("noop", lambda o, _: Noop(o.group_rank, o.group_size),
                                      extended_api=True, devices=["cpu"])


def _rank_main(rank, size, port, cfg, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np
    import torch
    import torch.distributed as dist

    import commlib.torch
    torch.set_num_threads(1)
    _noop_backend()
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    noop = dist.new_group(backend="noop")
    comm = commlib.torch.get_communicator()
    sizes, samples = [], {}
    b = cfg["minbytes"]
    while b <= cfg["maxbytes"]:
        sizes.append(b)
        b *= cfg["stepfactor"]
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        a, t = np.ones(n, np.float32), torch.ones(n)
        calls = {
            "comm_numpy": lambda: comm.all_reduce(a),
            "comm_torch": lambda: comm.all_reduce(t),
            "dist_commlib": lambda: dist.all_reduce(t),
            "dist_gloo": lambda: dist.all_reduce(t, group=gloo),
            "dist_noop": lambda: dist.all_reduce(t, group=noop),
        }
        for kind in KINDS:  # warm-up (plans, connections)
            for _ in range(20):
                calls[kind]()
        for _ in range(cfg["rounds"]):
            for kind in KINDS:
                k = cfg["calls"] if kind != "dist_gloo" else max(20, cfg["calls"] // 10)
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(k):
                    calls[kind]()
                samples.setdefault((kind, nbytes), []).append((time.perf_counter() - t0) / k * 1e6)
    comm.barrier()
    if rank == 0:
        med = {f"{k}:{s}": statistics.median(v) for (k, s), v in samples.items()}
        with open(out, "w") as f:
            json.dump({"sizes": sizes, "ranks": size, "median_us": med}, f)
    dist.destroy_process_group()


def _table(res) -> str:
    med = res["median_us"]
    lines = [f"| bytes | comm.all_reduce numpy | comm.all_reduce torch | dist.all_reduce commlib | "
             f"dist.all_reduce gloo | dist.all_reduce noop (torch's floor) | commlib - noop | "
             f"commlib - comm torch |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in res["sizes"]:
        v = {k: med[f"{k}:{s}"] for k in KINDS}
        lines.append(f"| {s} | " + " | ".join(f"{v[k]:.2f}" for k in KINDS)
                     + f" | {v['dist_commlib'] - v['dist_noop']:.2f}"
                     + f" | {v['dist_commlib'] - v['comm_torch']:.2f} |")
    return "\n".join(lines)


def run(args) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import tempfile
    cfg = {k: getattr(args, k) for k in ("minbytes", "maxbytes", "stepfactor", "rounds", "calls")}
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        procs = [ctx.Process(target=_rank_main, args=(r, args.np_, port, cfg, out))
                 for r in range(args.np_)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(1800)
        if any(p.exitcode != 0 for p in procs) or not os.path.exists(out):
            print("commlib bench-torch: a rank failed:", [p.exitcode for p in procs])
            return 1
        with open(out) as f:
            res = json.load(f)
    print(f"median µs per blocking all_reduce (float32), {args.np_} ranks, same processes")
    print(_table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
