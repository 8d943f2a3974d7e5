"""Where a step of bench/compress_netns.py's training goes, per rank and per thread (issue #41;
bench/RESULTS_compression.md, session 19).

    python bench/compress_train_profile.py [--arms none,int8:inter,int4:inter] [--steps 7]
                                           [--optimizer adam|adam-fused] [--ranks-per-host 2]
                                           [--env COMMLIB_TCP_SPIN_US=0,...] [--netns-prefix P] [--perf PATH]

Root only: the training of compress_netns.py (its model, data, batches and DataParallel with error
feedback) on two network namespaces joined by a 1 Gbit/s tc tbf link, one pool for every arm. Per
rank it prints, as medians over the steps after the first two: the main thread's phases
(wall-clock and the thread's CPU: forward, backward with the gradient hooks' work and the wait for
the buckets, error feedback's share of it, the optimizer step), and every thread's CPU seconds and
scheduler slices a step (/proc/<pid>/task/*/schedstat), which is what a loaded machine does not
distort: its wall-clock is the load's. ``--env`` sets commlib settings in every rank (an A/B of a
setting runs this twice).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def thread_counters() -> dict:
    """tid -> (on-CPU ns, ns waiting for a core, slices) of every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[tid] = tuple(map(int, f.read().split()))
        except OSError:  # a thread that ended meanwhile
            pass
    return out


def profile_rank(comm, data: bytes, codec, steps: int, rows: int, optimizer: str, perf_out: str = "") -> dict:
    """One rank's run of compress_netns.train_rank's loop, timed by phase; see the module's doc.
    ``perf_out``: also sample this rank's threads with ``perf record`` over the counted steps
    (``perf_out``.rank<r>.data; ``perf report -i`` shows where the CPU went, by function)."""
    import subprocess

    import torch

    import commlib.parallel.data_parallel as dp_module
    import compress_netns as cn
    from commlib.models import gpt
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    arr = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    train = arr[:int(len(arr) * 0.9)]
    dp = DataParallel(gpt.TinyGPT(gpt.GPTConfig(**cn.MODEL)), comm, compress=codec, error_feedback=codec is not None)
    opt = torch.optim.Adam(dp.parameters(), lr=cn.LR, **cn.OPTIMIZERS[optimizer])
    feedback_s = [0.0]
    round_ = dp_module.error_feedback_round

    def timed_round(*args, **kwargs):
        t = time.perf_counter()
        try:
            return round_(*args, **kwargs)
        finally:
            feedback_s[0] += time.perf_counter() - t
    dp_module.error_feedback_round = timed_round  # this rank process only
    g = torch.Generator().manual_seed(7)
    mine = slice(comm.rank * rows, (comm.rank + 1) * rows)
    records, first = [], None
    comm.barrier()
    for step in range(steps):
        if step == 2:
            if perf_out:
                perf = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-p", str(os.getpid()), "-o",
                                         f"{perf_out}.rank{comm.rank}.data"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                time.sleep(0.5)  # perf attaches
            first, t_first = thread_counters(), time.perf_counter()
        starts = torch.randint(0, len(train) - cn.SEQ - 1, (rows * comm.size,), generator=g)
        x = torch.stack([train[s:s + cn.SEQ + 1] for s in starts])
        feedback_s[0] = 0.0
        marks = [(time.perf_counter(), time.thread_time())]
        opt.zero_grad(set_to_none=True)
        loss = dp(x[mine, :-1], x[mine, 1:])
        marks.append((time.perf_counter(), time.thread_time()))
        loss.backward()
        marks.append((time.perf_counter(), time.thread_time()))
        opt.step()
        marks.append((time.perf_counter(), time.thread_time()))
        mean = np.array([loss.item()], np.float64)
        comm.all_reduce(mean, op="avg")
        marks.append((time.perf_counter(), time.thread_time()))
        (w0, c0), (w1, c1), (w2, c2), (w3, c3), (w4, c4) = marks
        records.append({"step": w4 - w0, "forward": w1 - w0, "backward": w2 - w1, "feedback": feedback_s[0],
                        "optimizer": w3 - w2, "cpu_forward": c1 - c0, "cpu_backward": c2 - c1,
                        "cpu_optimizer": c3 - c2})
    last, n = thread_counters(), steps - 2
    if perf_out:
        perf.send_signal(2)  # SIGINT: perf writes its file and exits
        perf.wait(timeout=60)
    threads = sorted(([(v[0] - first.get(t, (0, 0, 0))[0]) / 1e9 / n, (v[2] - first.get(t, (0, 0, 0))[2]) / n]
                      for t, v in last.items()), reverse=True)
    return {"rank": comm.rank, "loss": float(mean[0]), "wall_per_step_s": (time.perf_counter() - t_first) / n,
            "median": {k: float(np.median([r[k] for r in records[2:]])) for k in records[0]},
            "threads_cpu_s_and_slices_per_step": [[round(c, 4), int(s)] for c, s in threads if c > 0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="none,int8:inter,int4:inter", help="none = uncompressed; codecs as compress_netns")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--optimizer", default="adam", choices=("adam", "adam-fused"))
    p.add_argument("--ranks-per-host", type=int, default=2, choices=(1, 2, 4))
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--env", default="", help="NAME=VALUE,... set in every rank")
    p.add_argument("--netns-prefix", default=None, help="the namespaces' name prefix (default: scripts/netns.sh's)")
    p.add_argument("--perf", default="", help="PATH: perf record each rank over the counted steps (PATH.<arm>.rank<r>.data)")
    args = p.parse_args(argv)
    if args.steps < 3:
        raise SystemExit("compress_train_profile: --steps must be at least 3 (the first two are not counted)")
    for item in filter(None, args.env.split(",")):
        name, _, value = item.partition("=")
        os.environ[name] = value  # the pool's ranks take this process's environment
    import compress_netns as cn
    from commlib.testing.netns import Namespaces, NetnsRankPool
    data = cn.corpus()
    _, rows = cn.layout(args.ranks_per_host)
    print(f"# load average {os.getloadavg()}, env {args.env or '-'}, optimizer {args.optimizer}", flush=True)
    with Namespaces(cn.HOSTS, rate=args.rate, prefix=args.netns_prefix) as net:
        pool = NetnsRankPool(net, [h for h in range(cn.HOSTS) for _ in range(args.ranks_per_host)], timeout=120)
        try:
            for arm in filter(None, args.arms.split(",")):
                codec = None if arm == "none" else cn.parse_codec(arm)
                perf_out = f"{args.perf}.{arm.replace(':', '_')}" if args.perf else ""
                res = pool.run(__import__("compress_train_profile").profile_rank, data, codec, args.steps, rows,
                               args.optimizer, perf_out, timeout=1200)
                print(f"## {arm} (load {os.getloadavg()[0]:.1f})", flush=True)
                for r in res:
                    print(json.dumps(r), flush=True)
        finally:
            pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
