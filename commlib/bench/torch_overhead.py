"""``commlib bench-torch``: what a blocking collective costs through torch.distributed.

    commlib bench-torch --np 2 -b 8 -e 64K [--collectives all_reduce,broadcast] [--json FILE]

Every rank process measures, in the same processes and interleaved in rounds, the median time per
blocking call of each collective and size for:

* ``comm.<collective>`` on a NumPy array and on a torch CPU tensor (the commlib core alone);
* ``dist.<collective>`` over the "commlib" process group, and over a gloo group of the same ranks;
* ``dist.<collective>`` over torch's own C++ do-nothing backend ("fake",
  ``torch.testing._internal.distributed.fake_pg``): the floor of torch's dispatch (Python wrapper,
  c10d dispatcher, Work) that any C++ backend pays before it runs. It needs no peer: at several
  ranks every rank runs its own;
* ``dist.<collective>`` over a do-nothing *Python* ProcessGroup ("noop"): the floor of a backend
  written in Python, as commlib's is (no dispatcher, but a Python method and torch's options
  objects);
* "fake then core": ``dist.<collective>`` over "fake" followed by ``comm.<collective>`` on the
  tensor: what an ideal C++ backend would cost (torch's floor plus the core's own work, nothing
  in between). At several ranks it also carries the effect of the extra time per call on how the
  ranks meet, which the fake floor alone does not.

Rank 0 prints one Markdown table per collective (µs, medians over rounds of per-round means) with
"commlib − fake", the cost commlib adds above torch's own floor. ``--clock cpu`` times the CPU the
rank process used instead of elapsed time: on a shared, busy machine preemption inflates wall
times (by whole scheduler slices, unevenly across kinds), while at 1 rank, where no call waits,
CPU time is what the call costs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import statistics
import time

KINDS = ("comm_numpy", "comm_torch", "dist_commlib", "dist_gloo", "dist_fake", "dist_noop",
         "fake_then_core")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "barrier")
# what "bytes" means per collective
SIZE_MEANING = {
    "all_reduce": "the tensor", "broadcast": "the tensor", "reduce": "the tensor",
    "all_gather_into_tensor": "each rank's input", "reduce_scatter_tensor": "each rank's output",
    "all_to_all_single": "each rank's input (and output)", "barrier": "(no data)",
}


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("--np", type=int, default=2, dest="np_", help="ranks (default 2)")
    p.add_argument("-b", "--minbytes", type=int, default=8, help="smallest size in bytes (default 8)")
    p.add_argument("-e", "--maxbytes", type=int, default=65536, help="largest size (default 65536)")
    p.add_argument("-f", "--stepfactor", type=int, default=8, help="size factor (default 8)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help="comma-separated, of: " + ", ".join(COLLECTIVES) + " (default: all)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--calls", type=int, default=300, help="calls per kind, size and round (default 300)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time (default); cpu: CPU time of the rank process, all its "
                        "threads (not inflated when other jobs preempt it on a busy machine; at 1 "
                        "rank nothing waits, so it is the wall time of an idle machine)")
    p.add_argument("--json", metavar="FILE", help="write the medians here")


def _noop_backend():
    """Register "noop": a Python ProcessGroup whose every collective returns a completed work."""
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

        def _done(self, *args, **kwargs):
            return self._work

        allreduce = broadcast = reduce = all_gather_single = _allgather_base = _done
        reduce_scatter_single = _reduce_scatter_base = all_to_all_single = alltoall_base = _done
        barrier = _done

    if "NOOP" not in dist.Backend._plugins:
        dist.Backend.register_backend("noop", lambda o, _: Noop(o.group_rank, o.group_size),
                                      extended_api=True, devices=["cpu"])


def _calls(coll, nbytes, P, comm, groups):
    """{kind: zero-argument call} for one collective and size (float32)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    n = max(1, nbytes // 4)
    if coll == "all_to_all_single":
        n = max(P, n - n % P)
    a, t = np.ones(n, np.float32), torch.ones(n)
    # the other buffer: P times larger (all-gather output, reduce-scatter input), or all-to-all's
    # output
    m = n * P if coll in ("all_gather_into_tensor", "reduce_scatter_tensor") else n
    big_a, big_t = np.ones(m, np.float32), torch.ones(m)

    comm_call = {
        "all_reduce": lambda x, big: comm.all_reduce(x),
        "broadcast": lambda x, big: comm.broadcast(x, root=0),
        "reduce": lambda x, big: comm.reduce(x, root=0),
        "all_gather_into_tensor": lambda x, big: comm.all_gather(big, x),
        "reduce_scatter_tensor": lambda x, big: comm.reduce_scatter(x, big),
        "all_to_all_single": lambda x, big: comm.all_to_all(big, x),
        "barrier": lambda x, big: comm.barrier(),
    }[coll]
    dist_call = {
        "all_reduce": lambda g: dist.all_reduce(t, group=g),
        "broadcast": lambda g: dist.broadcast(t, src=0, group=g),
        "reduce": lambda g: dist.reduce(t, dst=0, group=g),
        "all_gather_into_tensor": lambda g: dist.all_gather_into_tensor(big_t, t, group=g),
        "reduce_scatter_tensor": lambda g: dist.reduce_scatter_tensor(t, big_t, group=g),
        "all_to_all_single": lambda g: dist.all_to_all_single(big_t, t, group=g),
        "barrier": lambda g: dist.barrier(group=g),
    }[coll]
    return {
        "comm_numpy": lambda: comm_call(a, big_a),
        "comm_torch": lambda: comm_call(t, big_t),
        **{f"dist_{name}": (lambda g=g: dist_call(g)) for name, g in groups.items()},
        "fake_then_core": lambda: (dist_call(groups["fake"]), comm_call(t, big_t)),
    }


def _rank_main(rank, size, port, cfg, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)  # the *_tensor names' deprecation
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    import commlib.torch
    torch.set_num_threads(1)
    _noop_backend()
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timeout)  # (run()'s server)
    dist.init_process_group("commlib", store=store, rank=rank, world_size=size, timeout=timeout)
    groups = {"commlib": None, "gloo": dist.new_group(backend="gloo"),
              "fake": dist.new_group(backend="fake"), "noop": dist.new_group(backend="noop")}
    comm = commlib.torch.get_communicator()
    sizes = []
    b = cfg["minbytes"]
    while b <= cfg["maxbytes"]:
        sizes.append(b)
        b *= cfg["stepfactor"]
    clock = time.perf_counter if cfg["clock"] == "wall" else time.process_time
    samples, missing = {}, {}
    for coll in cfg["collectives"]:
        for nbytes in (sizes if coll != "barrier" else sizes[:1]):
            calls = _calls(coll, nbytes, size, comm, groups)
            for kind in KINDS:  # warm-up (plans, connections); a backend may lack the call
                try:
                    for _ in range(20):
                        calls[kind]()
                except Exception as e:  # noqa: BLE001 - reported as n/a with the reason
                    missing[f"{kind}:{coll}"] = f"{type(e).__name__}: {str(e)[:120]}"
                    calls.pop(kind)
            for _ in range(cfg["rounds"]):
                for kind, fn in calls.items():
                    k = cfg["calls"] if kind != "dist_gloo" else max(20, cfg["calls"] // 10)
                    comm.barrier()
                    t0 = clock()
                    for _ in range(k):
                        fn()
                    dt = (clock() - t0) / k * 1e6
                    samples.setdefault(f"{coll}:{kind}:{nbytes}", []).append(dt)
    comm.barrier()
    if rank == 0:
        med = {key: statistics.median(v) for key, v in samples.items()}
        with open(out, "w") as f:
            json.dump({"sizes": sizes, "ranks": size, "collectives": cfg["collectives"],
                       "median_us": med, "missing": missing}, f)
    dist.destroy_process_group()


def tables(res) -> str:
    """One Markdown table per collective."""
    med = res["median_us"]
    out = []
    for coll in res["collectives"]:
        out += [f"### {coll} (bytes: {SIZE_MEANING[coll]})", "",
                "| bytes | comm numpy | comm torch | dist commlib | dist gloo | dist fake (C++ floor) "
                "| dist noop (Python floor) | fake then core (ideal C++ backend) | commlib − fake "
                "| commlib − ideal |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for s in (res["sizes"] if coll != "barrier" else res["sizes"][:1]):
            v = {k: med.get(f"{coll}:{k}:{s}") for k in KINDS}
            cells = [f"{x:.2f}" if x is not None else "n/a" for x in v.values()]
            diff = lambda x, y: f"{x - y:+.2f}" if x is not None and y is not None else "n/a"  # noqa: E731
            out.append(f"| {s if coll != 'barrier' else '-'} | " + " | ".join(cells)
                       + f" | {diff(v['dist_commlib'], v['dist_fake'])}"
                       + f" | {diff(v['dist_commlib'], v['fake_then_core'])} |")
        out.append("")
    for key, why in sorted(res.get("missing", {}).items()):
        out.append(f"n/a {key}: {why}")
    return "\n".join(out)


def serve_rendezvous_store():
    """torch's TCPStore served by this process on a port the kernel picks as it binds, and the port:
    the ranks connect to it. Picking a free port and letting rank 0 bind it later raced with any
    process that took the port meanwhile (EADDRINUSE, seen under load)."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=120))
    return store, store.port


def run(args) -> int:
    colls = [c.strip() for c in args.collectives.split(",") if c.strip()]
    for c in colls:
        if c not in COLLECTIVES:
            print(f"commlib bench-torch: --collectives: unknown {c!r} (expected: {', '.join(COLLECTIVES)})")
            return 2
    import tempfile
    store, port = serve_rendezvous_store()
    cfg = {k: getattr(args, k) for k in ("minbytes", "maxbytes", "stepfactor", "rounds", "calls", "clock")}
    cfg["collectives"] = colls
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
    del store  # (the server stops with its last reference)
    print(f"median µs ({args.clock} clock) per blocking call (float32), {args.np_} ranks, same "
          f"processes, {args.rounds} rounds x {args.calls} calls (gloo: a tenth)")
    print(tables(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
