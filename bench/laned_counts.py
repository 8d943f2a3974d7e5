"""Where a laned call's time goes on the host, in counts that do not depend on the load (issue #39,
session 28): per rank and call, the CPU seconds (getrusage: user + system, every thread of the rank),
voluntary and involuntary context switches, and the executor's own counters (steps finished ahead
of list order, bytes parked, single-copy reads while parked), for rail_ring's laned form against
the same schedule in list order and merged by rounds (bench/laned_list_order.py). Wall time is
printed too, as the median per call, but on a loaded machine it is noise: the counts are the point.

    .venv/bin/python bench/laned_counts.py --np 8 --hosts 2 --sizes 64K,1M,16M --iters 20

The ranks run in one pool (commlib.testing.RankPool) on emulated hosts (COMMLIB_HOST_ID per rank:
shared memory inside a host, TCP over loopback between hosts), as ``commlib bench --hosts``.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
FORMS = ("", "_in_list_order", "_merged_rounds")


def _parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _call(comm, collective, x, out, algorithm):
    if collective == "all_reduce":
        comm.all_reduce(x, algorithm=algorithm, out=out)
    elif collective == "all_gather":
        comm.all_gather(out, x, algorithm=algorithm)
    else:
        comm.reduce_scatter(out, x, algorithm=algorithm)


def _counters(core):
    """The executor's and the TCP links' counters now (docs/DESIGN.md "Laned calls")."""
    w = core.wait_counts()
    tcp = core.tcp_stats()
    return {"ahead": core.steps_ahead(), "parked_kb": core.parked_bytes() / 1024, "passes": w["passes"],
            "idle_passes": w["idle_passes"], "waits": w["waits"], "landed_kb": tcp["landed"] / 1024,
            "recv_reads": tcp["recv_reads"]}


def rank_counts(comm, algorithm, collectives, sizes, iters, warmup):
    """On every rank: {(collective, form, bytes): counts per call}."""
    import numpy as np

    import laned_list_order  # noqa: F401  (registers the list-order and merged forms)

    P = comm.size
    core = comm._core
    out = {}
    for collective in collectives:
        for nbytes in sizes:
            n = max(P, nbytes // 4 // P * P)
            if collective == "all_reduce":
                x, y = np.ones(n, np.float32), np.empty(n, np.float32)
            elif collective == "all_gather":
                x, y = np.ones(n // P, np.float32), np.empty(n, np.float32)
            else:
                x, y = np.ones(n, np.float32), np.empty(n // P, np.float32)
            for form in FORMS:
                name = algorithm + form
                for _ in range(warmup):
                    _call(comm, collective, x, y, name)
                comm.barrier()
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                c0 = _counters(core)
                walls = []
                for _ in range(iters):
                    t = time.perf_counter()
                    _call(comm, collective, x, y, name)
                    walls.append(time.perf_counter() - t)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                c1 = _counters(core)
                comm.barrier()
                out[(collective, form, nbytes)] = {
                    "cpu_us": 1e6 * ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / iters,
                    "sys_us": 1e6 * (r1.ru_stime - r0.ru_stime) / iters,
                    "vcsw": (r1.ru_nvcsw - r0.ru_nvcsw) / iters,
                    "ivcsw": (r1.ru_nivcsw - r0.ru_nivcsw) / iters,
                    **{k: (c1[k] - c0[k]) / iters for k in c0},
                    "wall_us": 1e6 * statistics.median(walls),
                }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--algorithm", default="rail_ring")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--sizes", default="64K,1M,16M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ab-hosts", type=int, default=0,
                    help="build the list-order and merged forms for this many hosts instead of --hosts "
                         "(1 with --hosts 2: the A/B before session 28, which compared different schedules)")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import laned_counts
    from commlib.bench.hosts import host_of_ranks
    from commlib.testing import RankPool

    host_of = host_of_ranks(a.np, a.hosts)
    env = {"COMMLIB_SOCKET_IFNAME": "lo", "LANED_AB_HOSTS": str(a.ab_hosts or a.hosts),
           "LOCAL_WORLD_SIZE": tuple(str(host_of.count(h)) for h in host_of)}
    if a.hosts > 1:
        env["COMMLIB_HOST_ID"] = tuple(f"host{h}" for h in host_of)
    sizes = [_parse_size(s) for s in a.sizes.split(",")]
    pool = RankPool(a.np, timeout=600, env=env)
    try:
        res = pool.run(laned_counts.rank_counts, a.algorithm, a.collectives.split(","), sizes, a.iters, a.warmup,
                       timeout=1800)
    finally:
        pool.close()
    print(f"# {a.np} ranks on {a.hosts} host(s), {a.algorithm}, {a.iters} calls each; load "
          f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
    print("# per call, summed over ranks (wall: median of rank 0, noise on a loaded machine)")
    keys = ("cpu_us", "sys_us", "vcsw", "ivcsw", "passes", "idle_passes", "waits", "ahead", "parked_kb",
            "landed_kb", "recv_reads")
    print(f"{'collective':14} {'bytes':>8} {'form':14} " + " ".join(f"{k:>11}" for k in keys) + f" {'wall_us':>8}")
    for key in res[0]:
        collective, form, nbytes = key
        tot = {k: sum(r[key][k] for r in res) for k in keys}
        print(f"{collective:14} {nbytes:8d} {(form or '_laned')[:14]:14} " + " ".join(f"{tot[k]:11.1f}" for k in keys) +
              f" {res[0][key]['wall_us']:8.0f}")


if __name__ == "__main__":
    main()
