"""Time from a SIGKILLed rank to the first completed step on the smaller communicator.

    .venv/bin/python bench/fault_recovery.py [--runs 5] [--sizes 4,8] [--out bench/RESULTS_fault.md]

Each run starts a fresh pool of ranks (commlib.testing.RankPool), trains a few steps (an all_reduce
of a 1 MiB float32 gradient per step), then the last rank records the wall-clock time in the store
and SIGKILLs itself before its next step. Every survivor reports, against that instant: when its
all_reduce raised PeerError (detect), when ``comm.shrink()`` returned (shrink) and when its first
all_reduce on the new communicator completed (first step). A run's number is the slowest survivor;
the table gives medians over runs. The peer measured in the same run: after that step the survivors
build a brand-new communicator of themselves with ``commlib.create`` (the rendezvous a restart
would need at least, without restarting processes or re-importing anything).

Layouts: every rank on one host (shared memory) and two emulated hosts (COMMLIB_HOST_ID, ranks
split in halves: TCP over loopback between the halves, shared memory within).

``--grow`` measures growing back instead (bench/grow_recovery.py): a torch model under
DataParallel, the kill, the shrink, a replacement process started then, which joins
(``commlib.join`` + ``DataParallel.joined``) and takes its first step at full size; against a
full restart of one process measured in the same run (process start, torch import, model build,
checkpoint load, rendezvous, first step). One host.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STEPS_BEFORE = 3
ELEMS = 1 << 18  # 1 MiB of float32


def rank_main(comm, victim):
    """One run on one rank (module-level: the pool imports it by name)."""
    import numpy as np

    from commlib.errors import PeerError
    from commlib.init import create
    grad = np.ones(ELEMS, dtype=np.float32)
    for _ in range(STEPS_BEFORE):
        comm.all_reduce(grad)
    if comm.rank == victim:
        comm._store.set("bench/kill", repr(time.time()).encode())
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(grad)
        raise AssertionError("the all_reduce after the kill completed")
    except PeerError:
        t_detect = time.time()
    new = comm.shrink()
    t_shrink = time.time()
    new.all_reduce(grad)
    t_step = time.time()
    # the peer: a fresh rendezvous of the same survivors
    new.barrier()
    t0 = time.time()
    fresh = create(comm._store, f"{comm._prefix}/bench_fresh", new.rank, new.size, comm.timeout)
    fresh.all_reduce(grad)
    t_fresh = time.time() - t0
    fresh.close()
    new.close()
    t_kill = float(comm._store.get("bench/kill"))
    return t_detect - t_kill, t_shrink - t_kill, t_step - t_kill, t_fresh


def one_run(size, hosts):
    from commlib.testing import RankPool
    env = {"COMMLIB_HOST_ID": tuple("ab"[r * 2 // size] for r in range(size))} if hosts == 2 else None
    pool = RankPool(size, timeout=120, env=env)
    try:
        res = pool.run(rank_main, size - 1, allow_death=True, timeout=120)
    finally:
        pool.kill()
    got = [r for r in res if r is not None]
    return [max(r[i] for r in got) for i in range(4)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="4,8")
    ap.add_argument("--out", default=None, help="write the markdown table here (else print it)")
    ap.add_argument("--grow", action="store_true", help="time growing back against a restart (see above)")
    args = ap.parse_args()
    if args.grow:
        return grow_table(args)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for hosts in (1, 2):
            runs = [one_run(size, hosts) for _ in range(args.runs)]
            med = [statistics.median(r[i] for r in runs) * 1e3 for i in range(4)]
            layout = "1 host (shm)" if hosts == 1 else "2 hosts (shm + tcp)"
            recover = statistics.median((r[2] - r[0]) * 1e3 for r in runs)
            rows.append(f"| {size} | {layout} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {recover:.1f} | "
                        f"{med[3]:.1f} | {recover / med[3]:.2f} |")
            print(rows[-1], flush=True)
    header = ("| ranks | layout | detect (ms) | shrink done (ms) | first step done (ms) | "
              "shrink + step, from detect (ms) | peer: fresh rendezvous + step (ms) | shrink+step / fresh |\n"
              "|---|---|---|---|---|---|---|---|")
    table = header + "\n" + "\n".join(rows)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n")
    else:
        print(table)


def grow_table(args):
    import tempfile

    import grow_recovery
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            runs = [grow_recovery.one_run(size, tmp) for _ in range(args.runs)]
        med = [statistics.median(r[i] for r in runs) for i in range(5)]
        rows.append(f"| {size} | {med[0] * 1e3:.0f} | {med[1]:.2f} | {med[2] * 1e3:.0f} | {med[3]:.2f} | "
                    f"{med[4] * 1e3:.0f} | {med[1] / med[3]:.2f} | {med[2] / med[4]:.2f} |")
        print(rows[-1], flush=True)
    header = ("| ranks | kill → first step shrunk (ms) | replacement: start → first step at full size (s) | "
              "of which join + state + step (ms) | restart of one process: start → first step (s) | "
              "of which checkpoint load + rendezvous + step (ms) | grow / restart | "
              "join part / restart part |\n|---|---|---|---|---|---|---|---|")
    table = header + "\n" + "\n".join(rows)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n")
    else:
        print(table)


if __name__ == "__main__":
    main()
