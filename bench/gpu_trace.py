"""Issue #38 item 6 on a GPU: one traced 64 MiB all_reduce on mapped buffers (COMMLIB_DEVICE_TRACE=1,
``mapped_fused_two_shot`` unless --algorithm: a message plan's, e.g. ``two_shot``, is traced too), 4 ranks on one GPU (run it under MPS), written as a
timeline per rank, block and step (scripts/gpu_check.sh, step ``trace``).

    python3 bench/gpu_trace.py --np 4 --out DIR          # DIR/trace.json (Chrome trace: Perfetto,
                                                        # chrome://tracing) and a per-step table
    python bench/gpu_trace.py --device emulated --np 2 --size 1M --out /tmp/t   # checks the script
                                                        # here; its numbers say nothing about a GPU

Each rank runs one warm-up call and the traced call, reads its records after a synchronize
(commlib/bench/device_trace.py), and the parent writes every rank's into one trace and prints the
per-step table (fastest and slowest block, when the step's last block ended) with the call's wall
time on the host, for docs/gpu.md's per-block model to be checked against.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def rank_main(comm, device, nbytes, algorithm):
    """(this rank's trace records of the traced call, its host-side seconds, whether the sum was right)."""
    from commlib.bench.device_trace import rank_trace
    from commlib.settings import overridden
    with overridden({"COMMLIB_DEVICE_PATH": "kernel", "COMMLIB_DEVICE_TRACE": "1"}):
        sub = comm.split(0, timeout=60)  # the engine, made at the first call, reads the settings
        try:
            n = nbytes // 4
            if device == "cuda":
                import torch
                torch.cuda.set_device(0)
                # torch's allocations: registered with the peers at the first call (lazily, docs/gpu.md)
                x = torch.full((n,), float(comm.rank + 1), device="cuda:0")
                y = torch.empty_like(x)
                sync = torch.cuda.synchronize
                first = lambda: float(y[0])  # noqa: E731
            else:
                import numpy as np

                import commlib.emulated as emu
                x = emu.from_numpy(np.full(n, comm.rank + 1, np.float32), shareable=True)
                y = emu.from_numpy(np.zeros(n, np.float32), shareable=True)
                sync = emu.synchronize
                first = lambda: float(y.numpy()[0])  # noqa: E731
            sub.all_reduce(x, out=y, algorithm=algorithm)  # warm-up: the plan, the peers' mappings
            sync()
            sub.barrier()
            t0 = time.perf_counter()
            sub.all_reduce(x, out=y, algorithm=algorithm)
            sync()
            seconds = time.perf_counter() - t0
            P = sub.size
            return rank_trace(sub), seconds, first() == P * (P + 1) / 2
        finally:
            sub.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--device", choices=("cuda", "emulated"), default="cuda")
    ap.add_argument("--size", default="64M", help="bytes per rank (K, M, G suffixes)")
    ap.add_argument("--algorithm", default="mapped_fused_two_shot")
    ap.add_argument("--out", required=True, help="directory for trace.json")
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args(argv)
    from commlib.bench.device_trace import read_trace, step_table, write_trace
    from commlib.testing.ranks import RankPool
    pool = RankPool(args.np, timeout=args.timeout, env={"COMMLIB_TIMEOUT": "30"})
    try:
        per_rank = pool.run(rank_main, args.device, _bytes(args.size), args.algorithm, timeout=args.timeout)
    finally:
        pool.close()
    records = [r for recs, _, _ in per_rank for r in recs]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "trace.json")
    write_trace(records, path, name=f"{args.algorithm} {args.size}")
    assert read_trace(path) == sorted(records, key=lambda r: (r["rank"], r["block"], r["step"]))
    blocks = {(r["rank"], r["block"]) for r in records}
    print(f"{args.np} ranks on {args.device} device 0: one traced {args.size} all_reduce ({args.algorithm}), "
          f"{len(blocks)} (rank, block)s, host wall {max(s for _, s, _ in per_rank) * 1e6:.0f} µs (slowest rank), "
          f"results {'right' if all(ok for _, _, ok in per_rank) else 'WRONG'}; trace: {path}")
    print()
    print(step_table(records))
    return 0 if records and all(ok for _, _, ok in per_rank) else 1


if __name__ == "__main__":
    sys.exit(main())
