"""A/B of TCP small-message latency settings in one run: two ranks in two network namespaces
joined by veth (scripts/netns.sh, root only) hold one sub-communicator per variant and take turns
round by round, so every variant sees the same load.

    python bench/tcp_latency_ab.py [--variants 'spin20=COMMLIB_TCP_SPIN_US=20;spin200=COMMLIB_TCP_SPIN_US=200']
                                   [--sizes 8,8192] [--calls 200] [--rounds 10]

A variant is NAME=VAR=VALUE[,VAR=VALUE...]; its settings are in the environment while its
sub-communicator is made (COMMLIB_* settings are read then). Prints, per size and variant, the
median over calls of the slowest rank's time per call (back-to-back float32 sum all_reduces,
auto's algorithm), and the ratio to the first variant, with the load average.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_variants(text):
    out = []
    for item in text.split(";"):
        name, _, settings = item.partition("=")
        env = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
        out.append((name, env))
    return out


def _rank_main(comm, variants, sizes, calls, rounds, algorithm):
    subs = {}
    for name, env in variants:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        subs[name] = comm.split(0)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    bufs = {s: (np.ones(s // 4, np.float32), np.empty(s // 4, np.float32)) for s in sizes}
    times = {(s, n): [] for s in sizes for n, _ in variants}
    pc = time.perf_counter
    for rnd in range(rounds + 1):
        order = [n for n, _ in variants]
        if rnd % 2:
            order.reverse()
        for s in sizes:
            x, y = bufs[s]
            for n in order:
                c = subs[n]
                c.barrier()
                n_calls = calls if s < (1 << 20) else max(3, calls // 40)  # large sizes: fewer calls
                for _ in range(10 if s < (1 << 20) else 1):
                    c.all_reduce(x, out=y, algorithm=algorithm)
                got = []
                for _ in range(n_calls):
                    t = pc()
                    c.all_reduce(x, out=y, algorithm=algorithm)
                    got.append(pc() - t)
                if rnd:  # the first round warms up
                    times[(s, n)].extend(got)
    for c in subs.values():
        c.close()
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="default=")
    p.add_argument("--sizes", default="8,8192")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--algorithm", default="auto")
    a = p.parse_args()
    variants = parse_variants(a.variants)
    sizes = [int(x) for x in a.sizes.split(",")]
    from commlib.testing.netns import Namespaces, NetnsRankPool

    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, here)
    import tcp_latency_ab as me

    load0 = os.getloadavg()[0]
    with Namespaces(2) as net:
        pool = NetnsRankPool(net, hosts=[0, 1], timeout=600)
        try:
            res = pool.run(me._rank_main, variants, sizes, a.calls, a.rounds, a.algorithm, timeout=590)
        finally:
            pool.close()
    print(f"# 2 hosts x 1 rank, veth, {a.rounds} rounds x {a.calls} calls, algorithm {a.algorithm}, "
          f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    for s in sizes:
        base = None
        for n, _ in variants:
            per_round = []
            slowest = [max(r[(s, n)][i] for r in res) for i in range(len(res[0][(s, n)]))]
            per = len(slowest) // a.rounds
            for k in range(a.rounds):
                per_round.append(statistics.median(slowest[k * per:(k + 1) * per]))
            med = statistics.median(slowest)
            base = base or med
            print(f"{s:9d} B  {n:14s} median {med * 1e6:9.2f} us  round medians "
                  f"{min(per_round) * 1e6:.1f}..{max(per_round) * 1e6:.1f}  first / this = {base / med:.2f}x")


if __name__ == "__main__":
    main()
