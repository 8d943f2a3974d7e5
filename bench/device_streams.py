"""The stream engine on the emulated device: one stream per call (COMMLIB_DEVICE_STREAMS=1)
against sends and receives on two streams (=2), in one run, with memcpy of the same bytes as the
yardstick. Emulated timing is host threads copying host memory, not GPU timing: it shows what the
split changes in the engine's ordering on this machine, nothing about a GPU.

    nice .venv/bin/python bench/device_streams.py [--np 4] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SIZES = [64 << 10, 1 << 20, 16 << 20]  # bytes (float32)
ALGOS = ["ring", "recursive_doubling"]


def _rank_times(comm, sizes, algos, reps):
    import commlib.device.emulated as emu
    out = {}
    for nbytes in sizes:
        n = nbytes // 4
        x = emu.from_numpy(np.ones(n, np.float32))
        for algo in algos:
            comm.all_reduce(x, algorithm=algo)  # warm-up: engine, schedule cache, inbox
            emu.synchronize()
            comm.barrier()
            t = time.perf_counter()
            for _ in range(reps):
                comm.all_reduce(x, algorithm=algo)
            emu.synchronize()
            out[(nbytes, algo)] = (time.perf_counter() - t) / reps
        a, b = np.ones(n, np.float32), np.empty(n, np.float32)
        t = time.perf_counter()
        for _ in range(reps):
            np.copyto(b, a)
        out[(nbytes, "memcpy")] = (time.perf_counter() - t) / reps
    return out


def main():
    from commlib.testing.ranks import close_pools, get_pool
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    pools = {s: get_pool(args.np, env={"COMMLIB_DEVICE_STREAMS": str(s), "COMMLIB_EMULATED_DELAY_US": "0"})
             for s in (1, 2)}
    samples = {}
    for _ in range(args.rounds):  # alternate the settings so load changes hit both alike
        for s, pool in pools.items():
            per_rank = pool.run(_rank_times, SIZES, ALGOS, args.reps, timeout=600)
            for key in per_rank[0]:
                samples.setdefault((s,) + key, []).append(max(r[key] for r in per_rank))
    close_pools()
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"| bytes | algorithm | 1 stream (ms) | 2 streams (ms) | 2 / 1 | 1 stream / memcpy |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for nbytes in SIZES:
        for algo in ALGOS:
            one, two = med[(1, nbytes, algo)], med[(2, nbytes, algo)]
            cp = med[(1, nbytes, "memcpy")]
            print(f"| {nbytes} | {algo} | {one * 1e3:.3f} | {two * 1e3:.3f} | {two / one:.2f} | {one / cp:.1f} |")


if __name__ == "__main__":
    main()
