"""Instructions per blocking call of the core itself (``comm.<collective>`` on NumPy buffers, the C++
entry ``_C.fast_collective``), at one rank or several: load-independent counts of what a small call
costs on one rank process ("Cost of a call" in docs/torch_backend.md; #42's small rows).

    python bench/core_call_instructions.py [--np 4] [--calls 2000] [--bytes 8]
        [--collectives all_reduce,broadcast,barrier,reduce_scatter,all_to_all,all_gather] [--rank 1]

Every rank is a real process on this host; rank ``--rank`` alone runs under ``valgrind
--tool=callgrind`` (the others run at full speed, so they are always ahead of it and it rarely
waits: what it counts is its own work per call, not the others' lateness). ``_C.callgrind_phase_mark()``
before and after ``--calls`` calls of each collective (after a warm-up and a barrier) makes callgrind
dump, so one dump holds one collective's calls. Per call, from that dump:

* ``whole``: every instruction of the process (Python's call of the method, the C++ entry, the core);
* ``core``: inclusive in ``Communicator::collective`` (the prologue, the queue, the plan, the run);
* ``wait``: inclusive in the executor's waits for peers (``Executor::wait_flags`` and the channel
  waits' ``Executor::on_idle``): what is left of waiting under the instrumented rank (small, and not
  the call's own cost).

Not a test (nothing is asserted); the counts move with the compiler, not the machine's load.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

from callgrind_counts import dump_total, inclusive  # (bench/, beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from commlib.bootstrap.ports import free_port  # noqa: E402

WAITS = ("commlib::Executor::wait_flags", "commlib::Executor::on_idle")


def _calls(comm, nbytes):
    """{collective: a blocking call of it on float32 buffers of `nbytes` per rank (all_to_all and
    all_gather: per block)}."""
    n = max(nbytes // 4, 1)
    P = comm.size
    a, out = np.ones(n, np.float32), np.ones(n, np.float32)
    big, big2 = np.ones(n * P, np.float32), np.ones(n * P, np.float32)
    return {
        "all_reduce": lambda: comm.all_reduce(a),
        "all_reduce_out": lambda: comm.all_reduce(a, out=out),
        "broadcast": lambda: comm.broadcast(a, 0),
        "barrier": lambda: comm.barrier(),
        "reduce_scatter": lambda: comm.reduce_scatter(out, big),
        "all_to_all": lambda: comm.all_to_all(big2, big),
        "all_gather": lambda: comm.all_gather(big2, a),
    }


def _rank_main(collectives, calls, nbytes):
    import commlib
    import commlib._C as _C
    comm = commlib.init()
    fns = _calls(comm, nbytes)
    for coll in collectives:
        fn = fns[coll]
        for _ in range(200):
            fn()
        comm.barrier()
        _C.callgrind_phase_mark()
        for _ in range(calls):
            fn()
        _C.callgrind_phase_mark()
        comm.barrier()
    comm.close()


def measure(np_, rank, collectives, calls, nbytes, keep=""):
    """{collective: {"whole", "core", "wait"}} per call on rank `rank` of `np_`."""
    with tempfile.TemporaryDirectory() as d:
        out_dir = keep or d
        me = [sys.executable, os.path.abspath(__file__), "--child", "--collectives", ",".join(collectives),
              "--calls", str(calls), "--bytes", str(nbytes)]
        port = free_port()  # below the ephemeral range: never handed to another bind(0)
        env = dict(os.environ, PYTHONPATH=ROOT, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", COMMLIB_TIMEOUT="900",
                   WORLD_SIZE=str(np_), LOCAL_WORLD_SIZE=str(np_), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs = []
        for r in range(np_):
            cmd = me
            if r == rank:
                cmd = ["valgrind", "--tool=callgrind", "--dump-before=*callgrind_phase_mark*",
                       f"--callgrind-out-file={out_dir}/cg.%p", "--quiet"] + me
            procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
        if any(p.wait(timeout=3600) for p in procs):
            raise RuntimeError("a rank failed")
        dumps = sorted(glob.glob(f"{out_dir}/cg.*.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        res = {}
        for k, coll in enumerate(collectives):
            dump = dumps[2 * k + 1]
            res[coll] = {
                "whole": dump_total(dump) / calls,
                "core": inclusive(dump, "commlib::Communicator::collective") / calls,
                "wait": sum(inclusive(dump, w) for w in WAITS) / calls,
            }
        return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--rank", type=int, default=-1, help="the rank under callgrind (default: 1, or 0 at --np 1)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--collectives", default="all_reduce,broadcast,barrier")
    ap.add_argument("--keep", default="", help="keep callgrind's dumps in this folder")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    collectives = [c for c in args.collectives.split(",") if c]
    if args.child:
        _rank_main(collectives, args.calls, args.bytes)
        return 0
    rank = args.rank if args.rank >= 0 else min(1, args.np - 1)
    res = measure(args.np, rank, collectives, args.calls, args.bytes, args.keep)
    print(f"Instructions per blocking call, rank {rank} of {args.np}, {args.bytes} B float32, {args.calls} calls "
          "(callgrind, PYTHONHASHSEED=0)\n")
    print("| collective | whole process | core call | of which waiting |")
    print("| --- | ---: | ---: | ---: |")
    for coll in collectives:
        r = res[coll]
        print(f"| {coll} | {round(r['whole']):,} | {round(r['core']):,} | {round(r['wait']):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
