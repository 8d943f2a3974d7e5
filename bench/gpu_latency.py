"""Where an all_reduce's time goes on a GPU: several ranks on one GPU (run it under MPS), both
device paths, three clocks per call, against torch's own do-nothing round trip in the same run.

    python3 bench/gpu_latency.py --np 4 [--json out.json]
    python bench/gpu_latency.py --device emulated --np 2 --reps 20 --no-large   # checks the script
                                                   # here; its numbers say nothing about a GPU
    python3 bench/gpu_latency.py --sizes 64M --algorithms two_shot,ring \
        --sweep COMMLIB_DEVICE_SLOT_BYTES=256K,1M,4M --sweep COMMLIB_DEVICE_SLOTS=4,8
                        # one rank pool per combination of the swept settings (a row's `config`)

Per (path, algorithm, size), medians over --reps calls, the slowest rank's value:
- ``sync``: the call plus a stream synchronize, as ``commlib bench --device cuda`` times it (the
  completion as the host sees it, host wake-up included);
- ``loop``: --reps calls back to back, one synchronize at the end, divided by --reps (nccl-tests'
  convention: the host runs ahead, so this is the GPU's time per call when the host keeps up);
- ``gpu``: CUDA events recorded around one call on its stream (the kernels' or copies' time on the
  GPU, waiting for the peers included);
- ``enqueue``: the host time of the call alone (Python, the binding, the launch).
The floor: ``floor`` rows time an 8-byte ``add_`` the same ways, and at the large sizes a
device-to-device ``copy_``, whose bandwidth (bytes copied / time) is the reference for the paths'. The numbers are read as ratios against those floors, measured in the same job.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

SMALL = (8, 4096, 65536)
LARGE = (64 << 20, 256 << 20)
# CUDA settings --sweep also takes (each value a fresh rank pool; a CUDA_ variable makes the pool
# spawn its ranks: it is read when CUDA starts): the hardware queues a process's streams share.
CUDA_SWEEPABLE = ("CUDA_DEVICE_MAX_CONNECTIONS",)


def _median(xs):
    return float(statistics.median(xs))


def _clocks(call, stream, reps):
    """{sync, loop, gpu, enqueue} in µs for `call` (medians over `reps`); gpu is None on the
    emulated device (no timing events)."""
    for _ in range(3):  # warm-up: plan caches, peer mappings, MPS clients
        call()
    stream.synchronize()
    sync, enq, gpu = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        stream.synchronize()
        t2 = time.perf_counter()
        enq.append(t1 - t0)
        sync.append(t2 - t0)
    gpu = None
    if not hasattr(stream, "__commlib_device__") and hasattr(stream, "cuda_stream"):  # a torch stream
        import torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for a, b in events:
            a.record(stream)
            call()
            b.record(stream)
        stream.synchronize()
        gpu = _median([a.elapsed_time(b) * 1e-3 for a, b in events]) * 1e6
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    stream.synchronize()
    loop = (time.perf_counter() - t0) / reps
    return {"sync": _median(sync) * 1e6, "loop": loop * 1e6, "gpu": gpu,
            "enqueue": _median(enq) * 1e6}


def _ones(device, n, staged=False):
    """n float32 ones on `device`; `staged` (emulated only): memory without a shareable handle, so
    no peer maps it and one-sided calls take the staged path (through the slots area)."""
    import numpy as np

    from commlib.perf.device_buffers import empty, fill
    if staged:
        from commlib.device import emulated
        return emulated.from_numpy(np.ones(n, np.float32), shareable=False)
    buf = empty(device, n, "float32")
    fill(buf, np.ones(n, np.float32))
    return buf


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)


def rank_main(comm, device, algorithms, reps, sizes, paths=("kernel", "copy"), staged=False):
    from commlib.bench import device_paths
    from commlib.bench.device import synchronizer
    from commlib.perf.device_buffers import to_host
    if device == "cuda":
        import torch
        torch.cuda.set_device(0)
        stream = torch.cuda.current_stream()
    else:
        from commlib.device import emulated
        stream = emulated.current_stream()
    assert synchronizer(device) is not None
    comms = device_paths.path_communicators(comm, device, list(paths))
    rows = []
    x = _ones(device, 2)
    comm.barrier()
    rows.append(dict(path="floor", algorithm="add_" if device == "cuda" else "copy_", bytes=8,
                     **_clocks((lambda: x.add_(1)) if device == "cuda" else (lambda: x.copy_(x)), stream, reps)))
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        buf = _ones(device, n, staged)
        r = reps if nbytes < (1 << 20) else max(5, reps // 20)
        if nbytes >= (1 << 20):
            src = _ones(device, n)
            comm.barrier()
            rows.append(dict(path="floor", algorithm="copy_", bytes=nbytes,
                             **_clocks(lambda: buf.copy_(src), stream, r)))
            del src
        for path, c in comms.items():
            for algo in algorithms:
                c.barrier()
                try:
                    t = _clocks(lambda: c.all_reduce(buf, algorithm=algo), stream, r)
                except ValueError as e:
                    # Refused before anything was sent, alike on every rank (a one-sided algorithm
                    # on the copy path, a staged call over the slots area): left out of the table,
                    # saying why, and the communicator runs the rest. Any other error is a failure.
                    rows.append(dict(path=path, algorithm=algo, bytes=nbytes, refused=str(e)))
                    continue
                ran = c._device_route.last_path()
                if algo == "auto":  # which candidate device auto took (policy/device_auto.h), beside the candidates
                    ran += ": " + c._device()._last_engine.last_algorithm()
                rows.append(dict(path=path, algorithm=algo, bytes=nbytes, ran=ran, **t))
        buf = _ones(device, n)
        next(iter(comms.values())).all_reduce(buf)
        if not (to_host(buf) == comm.size).all():
            rows.append(dict(path="check", algorithm="sum", bytes=nbytes, error="wrong result"))
        del buf
    return rows


def merge(per_rank):
    """The slowest rank's value per row and clock."""
    out = []
    for rows in zip(*per_rank):
        row = dict(rows[0])
        for k in ("sync", "loop", "gpu", "enqueue"):
            if row.get(k) is not None:
                row[k] = max(r[k] for r in rows)
        out.append(row)
    return out


def markdown(rows, np_, mps, device, swept=False):
    from commlib.perf.common import fmt_bytes
    where = "GPU 0" if device == "cuda" else "emulated device 0 (says nothing about a GPU)"
    lines = [f"{np_} ranks on {where}{' under MPS' if mps else ' (no MPS)'}; µs per call, the slowest rank's "
             "median; `loop` = calls back to back, one synchronize (nccl-tests' convention); "
             "`floor` rows: an 8-byte `add_` and a device-to-device `copy_` timed the same way.", "",
             ("| config " if swept else "") + "| path | algorithm | size | sync µs | loop µs | gpu µs | enqueue µs | "
             "GB/s (sync) | ran |",
             ("| --- " if swept else "") + "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    refused = []
    for r in rows:
        lead = f"| {r.get('config', '')} " if swept else ""
        if "refused" in r:
            refused.append(f"- {r.get('config', '') + ': ' if swept else ''}{r['path']} {r['algorithm']} at "
                           f"{fmt_bytes(r['bytes'])} left out, refused: {r['refused']}")
            continue
        if "error" in r:
            lines.append(lead + f"| {r['path']} | {r['algorithm']} | {fmt_bytes(r['bytes'])} | {r['error']} | | | | | |")
            continue
        gbs = r["bytes"] / (r["sync"] * 1e-6) / 1e9
        lines.append(lead + f"| {r['path']} | {r['algorithm']} | {fmt_bytes(r['bytes'])} | {r['sync']:.1f} | "
                     f"{r['loop']:.1f} | {'' if r['gpu'] is None else format(r['gpu'], '.1f')} | {r['enqueue']:.1f} | {gbs:.3g} | {r.get('ran', '')} |")
    return "\n".join(lines + ([""] + refused if refused else [])) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--device", choices=("cuda", "emulated"), default="cuda")
    ap.add_argument("--algorithms", default="direct,two_shot,ring")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--no-large", action="store_true", help="small sizes only")
    ap.add_argument("--sizes", default="", help="comma list of sizes in bytes (K, M, G suffixes); "
                    "default 8,4K,64K,64M,256M (without the last two with --no-large)")
    ap.add_argument("--paths", default="kernel,copy")
    ap.add_argument("--staged", action="store_true", help="emulated only: buffers no peer can map, so "
                    "one-sided algorithms stage through the slots area (COMMLIB_DEVICE_SLOTS x "
                    "COMMLIB_DEVICE_SLOT_BYTES); calls that do not fit are refused and left out")
    ap.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2",
                    help="a setting to sweep (repeatable): one rank pool per combination")
    ap.add_argument("--json", default="")
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args(argv)
    if args.staged and args.device != "emulated":
        ap.error("--staged: only on the emulated device (a CUDA tensor's memory is mapped where it can be)")
    import os

    from commlib.testing.ranks import RankPool
    mps = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
    sizes = ([parse_size(x) for x in args.sizes.split(",") if x] if args.sizes
             else list(SMALL + (() if args.no_large else LARGE)))
    axes = []
    for spec in args.sweep:
        name, _, values = spec.partition("=")
        if not (name.startswith("COMMLIB_") or name in CUDA_SWEEPABLE) or not values:
            raise SystemExit(f"gpu_latency: --sweep: expected COMMLIB_NAME=V1,V2 (or one of "
                             f"{', '.join(CUDA_SWEEPABLE)}), got {spec!r}")
        axes.append([(name, v) for v in values.split(",")])
    rows = []
    for combo in itertools.product(*axes) if axes else [()]:
        env = {"COMMLIB_TIMEOUT": "30", **dict(combo)}
        config = " ".join(f"{k.removeprefix('COMMLIB_DEVICE_').removeprefix('CUDA_DEVICE_').lower()}={v}"
                          for k, v in combo)
        pool = RankPool(args.np, timeout=args.timeout, env=env)
        try:
            per_rank = pool.run(rank_main, args.device, args.algorithms.split(","), args.reps, sizes,
                                args.paths.split(","), args.staged, timeout=args.timeout)
        finally:
            pool.close()
        rows += [dict(r, config=config) for r in merge(per_rank)]
    text = markdown(rows, args.np, mps, args.device, swept=bool(axes))
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "device": args.device, "mps": mps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
