"""The host cost of one steady device collective on the emulated device (issue #37, item 5): host
instructions per call (load-independent: callgrind, counting only inside the C++ entry
``fast_collective`` on the caller's thread) and µs per call against the emulated floor, for every
collective of the issue, blocking and async, on the kernel path, 2 ranks.

    python bench/launch_cost.py [--calls 200] [--json out.json]     # both, a markdown table
    python bench/launch_cost.py --no-callgrind                      # µs only

Not a test: the µs depend on the machine's load (read them as ratios to the floor, measured in the
same job); the instruction counts do not (they are what the emulated device's hot path executes,
not a GPU's: the CUDA runtime's own work is not in them).
- ``µs/call``: median over 5 batches of ``--calls`` calls back to back (the stream drained between
  batches), the slower rank;
- ``floor µs``: an 8-byte device-to-device copy enqueued from Python (``Array.copy_``) timed the
  same way: the cheapest enqueued operation, as torch's ``add_`` is on a GPU;
- ``instructions/call``: both ranks run under ``valgrind --tool=callgrind --toggle-collect`` on the
  entry; ``_C.callgrind_phase_mark()`` between phases makes callgrind dump (``--dump-before``), so
  each dump holds one phase's calls. Rank 0's, divided by ``--calls``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("blocking", "async")
KERNEL_ENV = {"COMMLIB_DEVICE_PATH": "kernel", "COMMLIB_TIMEOUT": "120"}


def _calls(comm):
    """{collective: call(async_op)} on 4-float emulated arrays of this rank."""
    import numpy as np

    import commlib.emulated as emu
    P, n = comm.size, 4
    mine = emu.from_numpy(np.arange(n, dtype=np.float32) + comm.rank)
    blocks = emu.from_numpy(np.arange(P * n, dtype=np.float32))
    out, gathered = emu.empty(n), emu.empty(P * n)
    return {
        "all_reduce": lambda a: comm.all_reduce(mine, out=out, async_op=a),
        "all_gather": lambda a: comm.all_gather(gathered, mine, async_op=a),
        "reduce_scatter": lambda a: comm.reduce_scatter(out, blocks, async_op=a),
        "broadcast": lambda a: comm.broadcast(mine, root=0, async_op=a),
        "reduce": lambda a: comm.reduce(mine, root=0, async_op=a),
        "all_to_all": lambda a: comm.all_to_all(gathered, blocks, async_op=a),
    }


def _batch_us(fn, calls, stream):
    """Median µs per call over 5 batches of `calls` calls of fn (drained between batches)."""
    per = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
        stream.synchronize()
    return statistics.median(per)


def rank_main(comm, calls, mark):
    """{"floor": µs, (collective, mode): µs}; with `mark`, _C.callgrind_phase_mark() before each
    phase and after the last (so dump k + 1 holds phase k's calls: PHASES order)."""
    import numpy as np

    import commlib._C as _C
    import commlib.emulated as emu
    stream = emu.current_stream()
    a, b = emu.from_numpy(np.ones(2, np.float32)), emu.empty(2)
    out = {"floor": _batch_us(lambda: b.copy_(a), calls, stream)}
    for name, call in _calls(comm).items():
        for mode in MODES:
            fn = (lambda c=call, x=(mode == "async"): c(x))
            for _ in range(3):  # warm-up: the engine, the plans, the C++ entry's cache
                fn()
            stream.synchronize()
            if mark:
                _C.callgrind_phase_mark()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[f"{name} {mode}"] = (time.perf_counter() - t0) / calls * 1e6 if mark else None
            stream.synchronize()
            if not mark:
                out[f"{name} {mode}"] = _batch_us(fn, calls, stream)
    if mark:
        _C.callgrind_phase_mark()
    return out


def _spawn(calls, callgrind_dir):
    """Runs 2 ranks (this script with --rank), under callgrind when `callgrind_dir`; their outputs."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(r), "--port", str(port), "--calls", str(calls)]
        if callgrind_dir:
            cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=*fast_collective*",
                   "--dump-before=*callgrind_phase_mark*", f"--callgrind-out-file={callgrind_dir}/cg.{r}.%p",
                   "--quiet"] + cmd + ["--mark"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, env={**os.environ, **KERNEL_ENV}, text=True))
    outs = [json.loads(p.communicate(timeout=1800)[0].strip().splitlines()[-1]) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("launch_cost: a rank failed")
    return outs


def _phase_instructions(callgrind_dir, phases):
    """Rank 0's instructions per phase from its dumps (dump k + 1 is phase k)."""
    files = glob.glob(f"{callgrind_dir}/cg.0.*")
    def order(f):
        m = re.search(r"\.(\d+)$", f)
        return int(m.group(1)) if m and f.count(".") > 2 else 0
    totals = []
    for f in sorted(files, key=order):
        with open(f) as fh:
            m = re.search(r"^(?:totals|summary): (\d+)", fh.read(), re.M)
        totals.append(int(m.group(1)) if m else 0)
    # callgrind's files: cg.0.<pid> (the final dump, after the last mark) and cg.0.<pid>.<k>.
    dumps = totals[1:] + totals[:1]
    return {p: dumps[k + 1] for k, p in enumerate(phases) if k + 1 < len(dumps)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mark", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank >= 0:  # one rank
        import commlib
        comm = commlib.init(args.rank, 2, master_addr="127.0.0.1", master_port=args.port)
        try:
            print(json.dumps(rank_main(comm, args.calls, args.mark)))
        finally:
            comm.close()
        return 0
    timed = _spawn(args.calls, None)
    us = {k: max(o[k] for o in timed) for k in timed[0]}
    phases = [k for k in timed[0] if k != "floor"]
    instr = {}
    if not args.no_callgrind:
        with tempfile.TemporaryDirectory() as d:
            _spawn(args.calls, d)
            instr = {p: n / args.calls for p, n in _phase_instructions(d, phases).items()}
    lines = [f"2 ranks on emulated device 0, kernel path, 4 floats, {args.calls} calls per batch; the "
             f"floor (an 8 B Array.copy_ from Python): {us['floor']:.1f} µs per call.", "",
             "| collective | mode | µs/call | × floor | instructions/call (C++ entry) |",
             "| --- | --- | ---: | ---: | ---: |"]
    for p in phases:
        name, mode = p.split()
        n = instr.get(p)
        lines.append(f"| {name} | {mode} | {us[p]:.1f} | {us[p] / us['floor']:.2f} | "
                     f"{'' if n is None else format(round(n), ',')} |")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"us": us, "instructions_per_call": instr, "calls": args.calls}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
