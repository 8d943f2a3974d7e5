"""Instructions per blocking ``dist.<collective>`` call (issue #44 item 3, "Cost of a call" in
docs/torch_backend.md): load-independent counts, where ``commlib bench-torch`` gives times.

    python bench/torch_call_instructions.py [--calls 2000] [--collectives all_reduce,broadcast,barrier]

One rank, a float32 tensor of 8 elements, ``PYTHONHASHSEED=0``. Each backend ("commlib", and
torch's do-nothing C++ backend "fake", the floor any C++ backend pays) runs in its own process
under ``valgrind --tool=callgrind``; ``_C.callgrind_phase_mark()`` before and after ``--calls``
calls of each collective makes callgrind dump, so one dump holds one collective's calls (after a
warm-up). Per call, from that dump:

* ``whole``: every instruction of the process (Python's wrapper, the dispatcher, the backend,
  the work's ``wait()`` and release);
* ``ProcessGroup``: inclusive in torch's ``c10d::ProcessGroup::<method>`` (the dispatcher and the
  backend);
* ``backend``: inclusive in the backend's own method (``CommlibBackend::<method>``; fake's
  ``FakeProcessGroup::<method>``);
* ``core``: inclusive in the core's ``Communicator::collective`` (commlib only).

Not a test (nothing is asserted); the counts move with the compiler and torch's version, not the
machine's load.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

from callgrind_counts import dump_total, inclusive  # (bench/, beside this script)

# dist's function, torch's ProcessGroup method, the backend's method
CALLS = {
    "all_reduce": ("allreduce", "allreduce"),
    "broadcast": ("broadcast", "broadcast"),
    "barrier": ("barrier", "barrier"),
    "reduce": ("reduce", "reduce"),
    "all_gather_into_tensor": ("_allgather_base", "_allgather_base"),
    "reduce_scatter_tensor": ("_reduce_scatter_base", "_reduce_scatter_base"),
    "all_to_all_single": ("alltoall_base", "alltoall_base"),
}
BACKEND_CLASS = {"commlib": "commlib::torch_backend::CommlibBackend", "fake": "c10d::FakeProcessGroup"}


def _rank_main(backend, collectives, calls):
    """One process: init a 1-rank group of `backend`, then per collective warm up and run `calls`
    calls between two phase marks."""
    import datetime
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    import torch.distributed as dist

    import commlib._C as _C
    if backend == "fake":
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    else:
        import commlib.torch  # noqa: F401  (registers "commlib")
    torch.set_num_threads(1)
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    t, big = torch.ones(8), torch.ones(8)
    fns = {
        "all_reduce": lambda: dist.all_reduce(t),
        "broadcast": lambda: dist.broadcast(t, src=0),
        "reduce": lambda: dist.reduce(t, dst=0),
        "barrier": lambda: dist.barrier(),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(big, t),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(t, big),
        "all_to_all_single": lambda: dist.all_to_all_single(big, t),
    }
    for coll in collectives:
        fn = fns[coll]
        for _ in range(200):
            fn()
        _C.callgrind_phase_mark()
        for _ in range(calls):
            fn()
        _C.callgrind_phase_mark()
    dist.destroy_process_group()


def measure(backend, collectives, calls):
    """{collective: {"whole", "ProcessGroup", "backend", "core"}} per call for `backend`."""
    with tempfile.TemporaryDirectory() as d:
        cmd = ["valgrind", "--tool=callgrind", "--dump-before=*callgrind_phase_mark*",
               f"--callgrind-out-file={d}/cg.%p", "--quiet", sys.executable, os.path.abspath(__file__),
               "--child", backend, "--collectives", ",".join(collectives), "--calls", str(calls)]
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, env=env, timeout=3600)
        dumps = sorted(glob.glob(f"{d}/cg.*.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        # dump 2k+1 (1-based k order: before mark 2k+1 ... ) -> the calls of collective k are
        # between mark 2k and mark 2k+1: the dump taken before mark 2k+1, i.e. the (2k+2)th dump
        out = {}
        for k, coll in enumerate(collectives):
            dump = dumps[2 * k + 1]
            pg, be = CALLS[coll]
            out[coll] = {
                "whole": dump_total(dump) / calls,
                "ProcessGroup": inclusive(dump, f"c10d::ProcessGroup::{pg}") / calls,
                "backend": inclusive(dump, f"{BACKEND_CLASS[backend]}::{be}") / calls,
                "core": (inclusive(dump, "commlib::Communicator::collective") / calls
                         if backend == "commlib" else None),
            }
        return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--collectives", default="all_reduce,broadcast,barrier")
    ap.add_argument("--backends", default="commlib,fake")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    collectives = [c for c in args.collectives.split(",") if c]
    if args.child:
        _rank_main(args.child, collectives, args.calls)
        return 0
    res = {b: measure(b, collectives, args.calls) for b in args.backends.split(",")}
    print(f"Instructions per blocking call, 1 rank, 8 floats, {args.calls} calls (callgrind, PYTHONHASHSEED=0)\n")
    print("| collective | backend | whole process | ProcessGroup::<method> | backend's method | core call |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for coll in collectives:
        for b in res:
            r = res[b][coll]
            core = "" if r["core"] is None else format(round(r["core"]), ",")
            print(f"| {coll} | {b} | {round(r['whole']):,} | {round(r['ProcessGroup']):,} | "
                  f"{round(r['backend']):,} | {core} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
