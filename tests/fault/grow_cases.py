"""Rank-side cases of test_grow.py: the pool's ranks train, lose a rank, shrink and grow back; the
joiners (commlib.testing.ExtraRank processes) call commlib.join. Every error case returns the
error each rank saw, so the test checks that all of them raised alike."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np

import commlib
from commlib.bootstrap import phases
from commlib.bootstrap.store import TCPStore
from commlib.errors import CommError, PeerError

import training_replay as tr

KILL_AT, GROW_AT = 2, 4  # steps (of training_replay.STEPS) at which a rank dies and one joins


def _train(c, w, step, sizes):
    """Steps ``step``.. of training_replay on ``c``: a PeerError shrinks (the step is redone); at
    GROW_AT a communicator smaller than 3 grows back to 3 (the joiner gets the step and w)."""
    while step < tr.STEPS:
        if step == GROW_AT and c.size < 3:
            grown = c.grow(1, timeout=60)
            c.close()
            c = grown
            state = np.concatenate([[step], w])
            c.broadcast(state, root=0)
        g = tr.gradient(w, step, c.rank)
        try:
            c.all_reduce(g)
        except PeerError:
            smaller = c.shrink()
            c.close()
            c = smaller
            continue
        w = w - tr.LR * g
        sizes.append(c.size)
        step += 1
    c.close()
    return w.tolist(), sizes


def case_kill_shrink_grow(comm, victim, port):
    """Rank ``victim`` dies at KILL_AT; the survivors shrink, grow back at GROW_AT, finish. The job
    is its own communicator (prefix "job") over the pool's store (at ``port``)."""
    c = commlib.init(rank=comm.rank, world_size=comm.size, store=TCPStore("127.0.0.1", port), prefix="job")
    w, step, sizes = np.zeros(tr.DIM), 0, []
    while step < KILL_AT:
        g = tr.gradient(w, step, c.rank)
        c.all_reduce(g)
        w = w - tr.LR * g
        sizes.append(c.size)
        step += 1
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    return _train(c, w, step, sizes)


def joiner_trains():
    """A replacement: joins the pool's job, gets the step and parameters, trains to the end."""
    c = commlib.join(prefix="job", timeout=60)
    state = np.zeros(1 + tr.DIM)
    c.broadcast(state, root=0)
    rank = c.rank
    w, sizes = _train(c, state[1:].copy(), int(state[0]), [])
    return rank, w, sizes


def _error(fn):
    try:
        fn()
        return "no error"
    except CommError as e:
        return f"{type(e).__name__}: {e}"


def joiner_expecting_error(timeout, die_at=None):
    """A joiner whose join should fail: returns the error it raised. ``die_at``: it dies at that
    step of the grown communicator's rendezvous (commlib.bootstrap.phases) instead."""
    if die_at is not None:
        phases.hook = lambda prefix, step: os._exit(3) if step == die_at else None
    return _error(lambda: commlib.join(prefix="pool", timeout=timeout))


def joiner_checks_in(prefix="pool"):
    """A good joiner of job ``prefix``: joins, takes part in one all_reduce of ranks, closes."""
    c = commlib.join(prefix=prefix, timeout=60)
    x = np.array([c.rank], np.int64)
    c.all_reduce(x)
    c.close()
    return int(x[0])


def _resources():
    return len(os.listdir("/proc/self/fd")), threading.active_count()


def case_grow_expecting_error(comm, timeout):
    """Every member grows by one; returns the error it raised (and its fds and threads before)."""
    before = _resources()
    return _error(lambda: comm.grow(1, timeout=timeout)), before


def case_grow_arguments(comm):
    """Bad arguments are refused before anything is sent, naming the argument."""
    out = {}
    for name, call in [("n_zero", lambda: comm.grow(0)), ("n_float", lambda: comm.grow(1.5)),
                       ("timeout_text", lambda: comm.grow(1, timeout="5")),
                       ("neither", lambda: comm.grow())]:
        try:
            call()
            out[name] = "accepted"
        except (TypeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {e}"
    return out


def case_grow_and_check_in(comm):
    """Every member grows by one, all_reduces its ranks with the joiner, closes the grown
    communicator; returns the sum and its fds and threads after."""
    grown = comm.grow(1, timeout=60)
    x = np.array([grown.rank], np.int64)
    grown.all_reduce(x)
    size = grown.size
    grown.close()
    return int(x[0]), size, _resources()


def case_split_children_grow_at_once(comm):
    """The pool's ranks split into {0, 2} and {1}; both children grow by one at the same time
    (each child is a job of its own prefix). Returns the child's prefix, the grown size and the
    grown communicator's sum of ranks."""
    child = comm.split(1 if comm.rank == 1 else 0)
    grown = child.grow(1, timeout=60)
    x = np.array([grown.rank], np.int64)
    grown.all_reduce(x)
    out = (child._prefix, grown.size, int(x[0]))
    grown.close()
    child.close()
    return out


def case_grow_while_a_member_dies(comm, victim, step):
    """Every member grows by one; ``victim`` dies at ``step`` of building the grown communicator
    (commlib.bootstrap.phases). Returns the error each survivor raised."""
    if comm.rank == victim:
        phases.hook = lambda prefix, s: os._exit(3) if s == step and "/grow" in prefix else None
    return _error(lambda: comm.grow(1, timeout=60))
