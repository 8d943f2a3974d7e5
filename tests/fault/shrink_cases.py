"""Rank-side cases of the core shrink tests: a rank is SIGKILLed, the survivors shrink and go on.

Each case runs in a fresh pool (``commlib.testing.faults.run_killing_one_rank``); the victim's
death retires the pool. Results are plain values the test compares with a one-process replay.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np

import training_replay as tr
from commlib.errors import CommError, PeerError


def die():
    """SIGKILL this process: no cleanup, no goodbye (as an OOM kill or a lost node)."""
    os.kill(os.getpid(), signal.SIGKILL)


def original_ranks(comm, me: int) -> list:
    """The original rank of every member of ``comm`` (all_gather of ``me``)."""
    out = np.zeros(comm.size, dtype=np.int64)
    comm.all_gather(out, np.array([me], dtype=np.int64))
    return [int(r) for r in out]


def case_train_shrink(comm, victim, kill_step=2, split_color=None):
    """SGD on the summed gradients; ``victim`` dies at ``kill_step``. Survivors catch PeerError,
    shrink, close the old communicator and redo the step. With ``split_color`` (rank -> color) the
    training runs on this rank's sub-communicator of ``split`` instead, and the world is shrunk too.
    Returns (params bytes, members by step, error message, new world size or None, leaks): leaks
    are the commlib mappings left and the descriptors and threads gained once every communicator
    (the pool's too) is closed."""
    me = comm.rank
    fds, threads = _fds(), _threads()
    group = comm if split_color is None else comm.split(split_color[me])
    w, members_by_step, message, step = np.zeros(tr.DIM), [], None, 0
    members = original_ranks(group, me)
    while step < tr.STEPS:
        if step == kill_step and me == victim:
            die()
        g = tr.gradient(w, step, me)
        try:
            group.all_reduce(g)
        except PeerError as exc:
            message = str(exc)
            smaller = group.shrink()
            if group is not comm:
                group.close()
            group = smaller
            members = original_ranks(group, me)
            continue  # the step again, on the survivors
        w = w - tr.LR * g
        members_by_step.append(members)
        step += 1
    world = None
    if split_color is not None:  # the world lost the victim too
        new_world = comm.shrink()
        world = new_world.size
        x = np.ones(1)
        new_world.all_reduce(x)
        assert x[0] == new_world.size
        new_world.close()
    if group is not comm:
        group.close()
    comm.close()  # the pool's: the dead rank's region goes with the last mapping (close is idempotent)
    leaks = (_maps(), _fds() - fds, _threads() - threads)
    return w.tobytes(), members_by_step, message, world, leaks


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _threads():
    return len(os.listdir("/proc/self/task"))


def _maps():
    with open("/proc/self/maps") as f:
        return sum("commlib:" in line for line in f)


def _try(fn):
    t0 = time.monotonic()
    try:
        fn()
    except CommError as exc:
        return f"{type(exc).__name__}: {exc}", round(time.monotonic() - t0, 2)
    return "no error", round(time.monotonic() - t0, 2)


def case_shrink_errors(comm, victim):
    """After ``victim`` (the last rank) died, the survivors get each misuse wrong in turn; every
    rank returns the (message, seconds) of each attempt (but rank ``last - 1``, which dies in the
    third). Five ranks.

    Three of the misuses name a live rank (2), which no caller will ever see gone: each caller
    naming it waits out shrink's grace for a named rank's death to show (CONFIRM_GRACE_S, 2 s)
    before it publishes its claim, 6 s of waiting per run that decide nothing here. The grace is
    cut to 0.2 s in this fresh pool (a death it would wait for, the victim's and rank 3's, is seen
    before each attempt: the first all_reduce and the second failure's own error show them)."""
    import commlib.core.shrink as cs
    cs.CONFIRM_GRACE_S = 0.2
    me, last = comm.rank, comm.size - 1
    if me == victim:
        die()
    x = np.ones(1)
    try:
        comm.all_reduce(x)  # every survivor learns of the death
    except PeerError:
        pass
    out = {}
    gone = [victim]
    # 1. survivors disagree: rank 1 also excludes rank 2 (alive)
    out["disagree"] = _try(lambda: comm.shrink(exclude=gone + [2] if me == 1 else gone))
    # 2. an excluded rank calls shrink: everyone excludes rank 2, which calls too
    out["excluded_caller"] = _try(lambda: comm.shrink(exclude=gone + [2]))
    # 3. a second failure during the shrink: rank `last - 1` dies once it published its claim
    if me == last - 1:
        cs._Agreement.agree = lambda self, excluded: die()
    out["second_failure"] = _try(lambda: comm.shrink())
    # 4. a live rank excluded: ranks 0 and 1 exclude rank 2, which does not call shrink
    if me == 2:
        out["live_excluded"] = ("not called", 0.0)
        out["old_comm"] = _try(lambda: comm.barrier())  # the failed communicator refuses at once
        time.sleep(0.5)
        return out
    out["live_excluded"] = _try(lambda: comm.shrink(exclude=[2, last - 1, victim]))
    return out
