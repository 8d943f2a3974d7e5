"""Host CPU of a torch-backend device call of a new shape on the emulated device (issue #44 item 3,
#37 item 2): the C++ backend's CUDA entry (its test seam ``CommlibBackend._device_collective``,
the ``device_run`` its CUDA calls take) running each call on fresh buffers from C++
(csrc/bindings/device_call_new_shape.cc), against the same calls through the Python device route
(where the backend handed every new shape before session 22: named the stream, so the Python
communicator's own entry hands it there too), the same calls through that entry (which runs a new
shape from C++ since session 23, ``DeviceCallCache::prepare_new_shape``), and against a steady call
of the backend's entry (the same buffers every time: a cache hit), all in the same job.

    python bench/new_shape_cost.py [--calls 300] [--json out.json]

Not a test. The number is the calling thread's CPU time per call (``time.thread_time``: the host
work of issuing the call, not the wall time; less sensitive to the machine's load than µs, not
immune to it: state the load), median of 5 batches, the slower rank, and its ratio to the steady
call. The seam's own cost (pybind11's argument conversion, a torch Work per call) is in the C++
rows, so they are an upper bound of what torch's dispatcher path costs. 2 ranks, emulated device 0,
kernel path, all_reduce of 16 floats, every buffer allocated before its batch and kept.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

KERNEL_ENV = {"COMMLIB_DEVICE_PATH": "kernel", "COMMLIB_TIMEOUT": "120"}
KINDS = ("steady (C++ hit)", "new shape from C++", "new shape through Python",
         "new shape through the Python entry")


def rank_main(comm, calls):
    """{kind: CPU µs per call (median of 5 batches)}, and the new shapes C++ ran."""
    import numpy as np

    import commlib._C as _C
    import commlib.emulated as emu
    from commlib.core.call_spec import COLLECTIVE, DTYPE, OP
    from commlib.torch import native
    from commlib.torch.backend import ProcessGroupCommlib

    pg = ProcessGroupCommlib(comm, comm.rank, comm.size)
    backend = native.wrap(pg)
    if backend is None:
        raise SystemExit("new_shape_cost: commlib._C_torch was not built")
    c, stream, kept = pg._comm, emu.current_stream(), []

    def seam(a):
        return backend._device_collective(int(COLLECTIVE["all_reduce"]), int(DTYPE["float32"]), a.count,
                                          a.data_ptr(), a.data_ptr(), int(OP["sum"]), 0, 1.0, False, 0, 0)
    steady = emu.from_numpy(np.ones(16, np.float32))
    c.all_reduce(steady)  # the set-up (engine, stream), and the steady call's cache entry
    per = {k: [] for k in KINDS}
    new0 = _C.device_native_new_shape_count()
    for _ in range(5):
        for kind in KINDS:
            fresh = [emu.from_numpy(np.ones(16, np.float32)) for _ in range(calls)]
            kept.extend(fresh)  # (never freed: no later buffer reuses their memory, so each is new)
            stream.synchronize()
            works = []
            t0 = time.thread_time()
            if kind == KINDS[0]:
                for _ in range(calls):
                    works.append(seam(steady))
            elif kind == KINDS[1]:
                for a in fresh:
                    works.append(seam(a))
            elif kind == KINDS[2]:
                for a in fresh:  # (a named stream: the Python device route's path)
                    works.append(c.all_reduce(a, async_op=True, stream=stream))
            else:
                for a in fresh:
                    works.append(c.all_reduce(a, async_op=True))
            per[kind].append((time.thread_time() - t0) / calls * 1e6)
            stream.synchronize()
            if any(w is None for w in works):
                raise SystemExit(f"new_shape_cost: {kind}: a call was declined")
    out = {k: statistics.median(v) for k, v in per.items()}
    out["new shapes run from C++"] = _C.device_native_new_shape_count() - new0
    pg.shutdown()
    return out


def _spawn(calls):
    from commlib.bootstrap.ports import free_port
    port = free_port()  # below the ephemeral range: never handed to another bind(0)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--port", str(port),
                               "--calls", str(calls)], stdout=subprocess.PIPE, env={**os.environ, **KERNEL_ENV},
                              text=True) for r in range(2)]
    outs = [json.loads(p.communicate(timeout=1800)[0].strip().splitlines()[-1]) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("new_shape_cost: a rank failed")
    return outs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json", default="")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank >= 0:  # one rank
        import commlib
        comm = commlib.init(args.rank, 2, master_addr="127.0.0.1", master_port=args.port)
        try:
            print(json.dumps(rank_main(comm, args.calls)))
        finally:
            comm.close()
        return 0
    outs = _spawn(args.calls)
    cpu = {k: max(o[k] for o in outs) for k in KINDS}
    floor = cpu[KINDS[0]]
    lines = [f"2 ranks on emulated device 0, kernel path, all_reduce of 16 floats, {args.calls} calls per batch, "
             f"median of 5; load {os.getloadavg()[0]:.1f}; new shapes run from C++ per rank: "
             f"{[o['new shapes run from C++'] for o in outs]}.", "",
             "| call | CPU µs/call (caller's thread) | × steady |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {cpu[k]:.1f} | {cpu[k] / floor:.2f} |" for k in KINDS]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_us": cpu, "calls": args.calls, "ranks": outs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
