"""Rank-side functions of the network-namespace tests (tests/multihost/test_netns*.py)."""
from __future__ import annotations

import time

import numpy as np


def all_reduce_until_error(comm, algorithm: str, seconds: float = 20.0):
    """All-reduces 1 MiB in a loop until a call raises (the test cuts a link meanwhile).
    Returns (error or None, wall-clock time of the error, calls that succeeded)."""
    x = np.ones(1 << 18, np.float32)
    end, done = time.time() + seconds, 0
    while time.time() < end:
        try:
            comm.all_reduce(x, algorithm=algorithm)
        except Exception as e:  # noqa: BLE001 - the test checks the type and the message
            return f"{type(e).__name__}: {e}", time.time(), done
        done += 1
    return None, time.time(), done


def sum_of_ranks(comm):
    x = np.full(200_000, comm.rank + 1, np.int64)
    comm.all_reduce(x, algorithm="ring")
    return bool((x == comm.size * (comm.size + 1) // 2).all())


def rail_ring_sum(comm, count: int = 1 << 18):
    """One rail_ring all_reduce of ``count`` int64; returns (exact, this rank's listening address)."""
    x = np.full(count, comm.rank + 1, np.int64)
    comm.all_reduce(x, algorithm="rail_ring")
    return bool((x == comm.size * (comm.size + 1) // 2).all()), comm._core.tcp_address()
