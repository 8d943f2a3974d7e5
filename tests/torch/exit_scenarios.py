"""Two-rank jobs that end in every way a training script may, each checked for a clean exit.

    python tests/torch/exit_scenarios.py --reps 3 [--scenario NAME ...]

Imports torch and commlib once, then for every scenario and repetition forks two rank processes
that run it and leave through the interpreter's normal finalization (a forked child that returns
from this script finalizes like any process: atexit handlers, module teardown, daemon threads still
running). Both ranks are pinned to one CPU with a third process spinning on it, so that threads are
preempted at the moments that matter (the SIGABRT at exit of #17 needed a busy machine); with two
CPUs, two jobs run at once, one per CPU (``--lanes``). Prints one
JSON line {scenario: [exit statuses]}; a status is the exit code, or -signal for a crash.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import commlib
import commlib.torch
import commlib.torch.at_exit
from commlib.bootstrap.ports import free_port


def _init(rank, port, timeout_s=20):
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=timeout_s))


def issue17(rank, port):
    """The reproduction of #17: commlib and gloo groups, the world destroyed, nothing closed."""
    _init(rank, port)
    comm = commlib.torch.get_communicator()
    t = torch.ones(2)
    for _ in range(20):
        dist.all_reduce(t)
        comm.all_reduce(t)
    g = dist.new_group(backend="gloo")
    dist.all_reduce(t, group=g)
    dist.destroy_process_group()


def nothing_destroyed(rank, port):
    """Groups of both backends left open, async works waited on, a gloo call last."""
    _init(rank, port)
    g = dist.new_group(backend="gloo")
    t = torch.ones(1000)
    works = [dist.all_reduce(t, async_op=True) for _ in range(4)]
    for w in works:
        w.wait()
    dist.all_reduce(t, group=g)


def comm_closed(rank, port):
    """A communicator closed by hand under a live group, and a gloo group."""
    _init(rank, port)
    g = dist.new_group(backend="gloo")
    sub = commlib.torch.get_communicator().split(0)
    sub.all_reduce(torch.ones(4))
    sub.close()
    dist.all_reduce(torch.ones(4), group=g)
    dist.barrier()


_KEEP = []  # objects left for the interpreter's teardown to destroy


def waiter_thread_at_exit(rank, port):
    """Rank 0 leaves a communicator of its own open (destroyed at teardown, which waits for its
    queued call) and a daemon thread waiting on an async call that rank 1 joins late: the wait
    returns while rank 0 finalizes, and that thread must not take the GIL back then."""
    _init(rank, port)
    sub = commlib.torch.get_communicator().split(0)
    x = torch.ones(8)
    if rank == 0:
        w = sub.all_reduce(x, async_op=True)
        threading.Thread(target=w.wait, daemon=True).start()
        _KEEP.append(sub)
        return
    time.sleep(0.5)
    sub.all_reduce(x)
    sub.close()


def sys_exit_in_thread(rank, port):
    """sys.exit in a worker thread (ends that thread only), then the main thread goes on."""
    _init(rank, port)
    th = threading.Thread(target=lambda: (dist.all_reduce(torch.ones(3)), sys.exit(3)))
    th.start()
    th.join()
    dist.new_group(backend="gloo")
    dist.all_reduce(torch.ones(3))


def exit_from_signal_handler(rank, port):
    """SIGTERM's handler calls sys.exit(0) with groups of both backends open."""
    _init(rank, port)
    g = dist.new_group(backend="gloo")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    dist.all_reduce(torch.ones(5))
    dist.all_reduce(torch.ones(5), group=g)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler exits before this ends
    raise AssertionError("SIGTERM's handler did not exit")


SCENARIOS = {f.__name__: f for f in (issue17, nothing_destroyed, comm_closed, waiter_thread_at_exit,
                                     sys_exit_in_thread, exit_from_signal_handler)}


def _status(raw: int) -> int:
    return os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else -os.WTERMSIG(raw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per job")
    ap.add_argument("--no-contention", action="store_true", help="no pinning, no spinner")
    ap.add_argument("--lanes", type=int, default=2, help="jobs at once, each on a CPU of its own (at most "
                    "the CPUs this process may use)")
    ap.add_argument("--quiesce-limit", type=float,
                    help="override commlib.torch.at_exit's wait for other threads (0: off, to "
                         "show what the tests catch without it)")
    args = ap.parse_args()
    if args.quiesce_limit is not None:
        commlib.torch.at_exit._QUIESCE_LIMIT_S = args.quiesce_limit
    # One lane per CPU (two at most): a lane runs its jobs one after another, each job's ranks and
    # spinner pinned to the lane's CPU, so every job still has one contended CPU to itself; two
    # CPUs run two jobs at once (all jobs on one CPU at once starve each other, no faster).
    cpus = sorted(os.sched_getaffinity(0))
    lanes = cpus[:1] if args.no_contention else cpus[:max(1, min(args.lanes, len(cpus)))]
    jobs = [name for name in args.scenario or list(SCENARIOS) for _ in range(args.reps)]
    results: dict = {}
    seconds: dict = {}
    running: dict = {}  # lane's CPU -> [name, spinner pid, rank pids, start, statuses]
    while jobs or running:
        while jobs and len(running) < len(lanes):
            cpu = next(c for c in lanes if c not in running)
            name, port, t0 = jobs.pop(0), free_port(), time.monotonic()
            spinner = 0 if args.no_contention else os.fork()
            if spinner == 0 and not args.no_contention:  # competes for the ranks' CPU until killed
                os.sched_setaffinity(0, {cpu})
                while True:
                    pass
            pids = []
            for rank in range(2):
                pid = os.fork()
                if pid == 0:
                    if not args.no_contention:
                        os.sched_setaffinity(0, {cpu})
                    SCENARIOS[name](rank, port)
                    return 0  # leaves main(): this rank finalizes like any script
                pids.append(pid)
            running[cpu] = [name, spinner, pids, t0, [None, None]]
        time.sleep(0.02)
        for cpu, (name, spinner, pids, t0, statuses) in list(running.items()):
            for i, pid in enumerate(pids):
                if statuses[i] is None:
                    statuses[i] = _poll(pid, t0 + args.timeout)
            if None in statuses:
                continue
            if spinner:
                os.kill(spinner, signal.SIGKILL)
                os.waitpid(spinner, 0)
            results.setdefault(name, []).extend(statuses)
            seconds.setdefault(name, []).append(round(time.monotonic() - t0, 2))
            del running[cpu]
    print(json.dumps({"status": results, "seconds": seconds}), flush=True)
    return 0


def _poll(pid: int, deadline: float):
    """Exit status of ``pid`` if it ended, else None; one still running after ``deadline`` is
    killed (status -9)."""
    done, raw = os.waitpid(pid, os.WNOHANG)
    if done:
        return _status(raw)
    if time.monotonic() < deadline:
        return None
    os.kill(pid, signal.SIGKILL)
    return _status(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    sys.exit(main())
