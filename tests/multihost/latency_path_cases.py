"""Rank-side checks for the TCP small-message path: a waiting caller reads its sockets itself,
keeps them between calls, hands them back when it stops polling, and a small frame costs one
recv (the lane's staging buffer). Values are integers, checked for exact equality."""
from __future__ import annotations

import time

import numpy as np


def stats(comm):
    return comm._core.tcp_stats()


def round_trips(comm, n):
    """n 8-byte all_reduces; returns (all right, deltas of every tcp_stats counter). Shared by the
    small-message path's and the zero-copy path's tests."""
    before = stats(comm)
    x = np.zeros(2, np.int64)
    ok = True
    for i in range(n):
        x[:] = comm.rank + i
        comm.all_reduce(x)
        ok &= bool((x == sum(q + i for q in range(comm.size))).all())
    after = stats(comm)
    return ok, {k: after[k] - before[k] for k in after}


def busy_receiver(comm, idle_s):
    """Rank 0 sends 8 bytes to rank 1 right after an all_reduce; rank 1 does something else for
    `idle_s` (not a commlib call) before it receives. Returns (received right, counter deltas
    from after the all_reduce to after the receive)."""
    x = np.ones(2, np.int64)
    comm.all_reduce(x)  # rank 1's caller now holds its sockets
    before = stats(comm)
    ok = True
    if comm.rank == 0:
        comm.send(np.array([7, 11], np.int64), 1)
    else:
        time.sleep(idle_s)
        y = np.zeros(2, np.int64)
        comm.recv(y, 0)
        ok = y.tolist() == [7, 11]
    after = stats(comm)
    comm.barrier()
    return ok, {k: after[k] - before[k] for k in after}


def mixed_sizes_queued(comm, sizes, idle_s):
    """Rank 0 sends messages of `sizes` int32 elements back to back while rank 1 is busy for
    `idle_s`, so its sockets hold many frames at once (several per staged read, frames cut
    across reads, the receive ring full with read-ahead bytes waiting); then rank 1 receives them
    in order. Returns the sizes whose message arrived wrong (rank 1)."""
    bad = []
    if comm.rank == 0:
        for k, n in enumerate(sizes):
            comm.send(np.arange(k, k + n, dtype=np.int32), 1)
    else:
        time.sleep(idle_s)
        for k, n in enumerate(sizes):
            y = np.full(n, -1, np.int32)
            comm.recv(y, 0)
            if not np.array_equal(y, np.arange(k, k + n, dtype=np.int32)):
                bad.append(n)
    comm.barrier()
    return bad
