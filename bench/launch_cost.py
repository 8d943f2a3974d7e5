"""The host cost of one steady device collective on the emulated device (issue #37, item 5): host
instructions per call (load-independent: callgrind, counting only inside the C++ entry
``fast_collective`` on the caller's thread) and µs per call against the emulated floor, for every
collective of the issue, blocking and async, on the kernel path, 2 ranks.

    python bench/launch_cost.py [--calls 200] [--json out.json]     # both, a markdown table
    python bench/launch_cost.py --no-callgrind                      # µs only
    python bench/launch_cost.py --stream named                      # on a stream named by stream=
    python bench/launch_cost.py --stream interface                  # ... by a __cuda_array_interface__

``--stream``: where the calls run (docs/gpu.md "One call from Python"): the current stream, one
named by ``stream=`` (read in C++: csrc/bindings/named_stream.cc) or the one each buffer's
``__cuda_array_interface__`` names (a view of the emulated array made once, as a caller holding a
CuPy array passes the same one every call).

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


class _Interface:
    """An emulated array seen through __cuda_array_interface__ (version 3) naming `stream`."""

    def __init__(self, array, stream):
        import numpy as np
        self.array = array  # keeps the memory alive
        self.__cuda_array_interface__ = {"shape": (array.count,), "typestr": np.dtype(array.dtype).str,
                                         "data": (array.data_ptr(), False), "version": 3, "stream": stream.handle}


def _calls(comm, on="current", stream=None):
    """{collective: call(async_op)} on 4-float emulated arrays of this rank, on the current stream
    or `stream` (`on`: "named", stream=; "interface", each buffer's interface naming it)."""
    import numpy as np

    import commlib.emulated as emu
    P, n = comm.size, 4
    v = (lambda a: _Interface(a, stream)) if on == "interface" else (lambda a: a)
    s = stream if on == "named" else None
    mine = v(emu.from_numpy(np.arange(n, dtype=np.float32) + comm.rank))
    blocks = v(emu.from_numpy(np.arange(P * n, dtype=np.float32)))
    out, gathered = v(emu.empty(n)), v(emu.empty(P * n))
    return {
        "all_reduce": lambda a: comm.all_reduce(mine, out=out, async_op=a, stream=s),
        "all_gather": lambda a: comm.all_gather(gathered, mine, async_op=a, stream=s),
        "reduce_scatter": lambda a: comm.reduce_scatter(out, blocks, async_op=a, stream=s),
        "broadcast": lambda a: comm.broadcast(mine, root=0, async_op=a, stream=s),
        "reduce": lambda a: comm.reduce(mine, root=0, async_op=a, stream=s),
        "all_to_all": lambda a: comm.all_to_all(gathered, blocks, async_op=a, stream=s),
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


def rank_main(comm, calls, mark, on="current"):
    """{"floor": µs, (collective, mode): µs}; with `mark`, _C.callgrind_phase_mark() before each
    phase and after the last (so dump k + 1 holds phase k's calls: PHASES order); `on`: as _calls'."""
    import numpy as np

    import commlib._C as _C
    import commlib.emulated as emu
    stream = emu.current_stream()
    a, b = emu.from_numpy(np.ones(2, np.float32)), emu.empty(2)
    out = {"floor": _batch_us(lambda: b.copy_(a), calls, stream)}
    if on != "current":  # the calls' stream, after the arrays' uploads
        stream = emu.Stream()
        calls_of = _calls(comm, on, stream)
        stream.wait_event(emu.current_stream().record_event())
    else:
        calls_of = _calls(comm)
    for name, call in calls_of.items():
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


def _spawn(calls, callgrind_dir, on="current"):
    """Runs 2 ranks (this script with --rank), under callgrind when `callgrind_dir`; their outputs."""
    from commlib.bootstrap.ports import free_port
    port = free_port()  # below the ephemeral range: never handed to another bind(0)
    procs = []
    for r in range(2):
        cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(r), "--port", str(port), "--calls", str(calls),
               "--stream", on]
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
    ap.add_argument("--stream", choices=("current", "named", "interface"), default="current")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mark", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank >= 0:  # one rank
        import commlib
        comm = commlib.init(args.rank, 2, master_addr="127.0.0.1", master_port=args.port)
        try:
            print(json.dumps(rank_main(comm, args.calls, args.mark, args.stream)))
        finally:
            comm.close()
        return 0
    timed = _spawn(args.calls, None, args.stream)
    us = {k: max(o[k] for o in timed) for k in timed[0]}
    phases = [k for k in timed[0] if k != "floor"]
    instr = {}
    if not args.no_callgrind:
        with tempfile.TemporaryDirectory() as d:
            _spawn(args.calls, d, args.stream)
            instr = {p: n / args.calls for p, n in _phase_instructions(d, phases).items()}
    lines = [f"2 ranks on emulated device 0, kernel path, 4 floats, {args.calls} calls per batch, on the "
             f"{args.stream} stream; the "
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
