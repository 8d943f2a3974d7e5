"""Rank-side checks for the TCP link's zero-copy paths: sends written from the caller's buffer,
receives landed straight in the destination, and callers reading their own sockets while they wait.

Values are small integers or int64 ramps, so every result is checked for exact equality.
"""
from __future__ import annotations

import time

import numpy as np

import commlib

# Larger than what the sockets and the receive ring buffer together (a few MiB on loopback), so
# a send cannot complete until the receiver reads it; odd, so the last 512 KiB chunk is partial.
LARGE = (24 << 20) // 8 + 12_345


def stats(comm):
    return comm._core.tcp_stats()


def send_then_overwrite(comm, receiver_delay_s):
    """Rank 0 sends a ramp to rank 1 and overwrites its buffer the moment send() returns; rank 1
    (after `receiver_delay_s`, so part of the message waits in its ring before the receive is
    posted) must get the ramp. Returns (received right, in-place bytes sent, bytes landed)."""
    before = stats(comm)
    if comm.rank == 0:
        x = np.arange(LARGE, dtype=np.int64)
        comm.send(x, 1)
        # send() returned: the buffer is the caller's again. The end first: the last chunks are
        # the ones a send that returned too early would still be writing.
        x[-(4 << 20) // 8:] = -1
        x[:] = -1
        y = np.arange(LARGE, dtype=np.int64) * 3
        comm.send(y, 1)
        y[-(4 << 20) // 8:] = -7
        y[::2] = -7
        ok = True
    elif comm.rank == 1:
        time.sleep(receiver_delay_s)
        got = np.zeros(LARGE, np.int64)
        comm.recv(got, 0)
        ok = bool(np.array_equal(got, np.arange(LARGE, dtype=np.int64)))
        comm.recv(got, 0)
        ok &= bool(np.array_equal(got, np.arange(LARGE, dtype=np.int64) * 3))
    else:
        ok = True
    comm.barrier()
    after = stats(comm)
    return ok, after["sent_in_place"] - before["sent_in_place"], after["landed"] - before["landed"]


def _vals(rank, n, salt=0):
    return ((np.arange(n, dtype=np.int64) * 7 + rank * 3 + salt) % 11 + 1)


def in_place_collectives(comm, count):
    """Collectives whose send and receive regions share one buffer, at a count that splits
    unevenly into ranks' blocks and 512 KiB chunks. Returns the failures (empty when right)."""
    P, r = comm.size, comm.rank
    bad = []
    for algo in ("ring", "recursive_doubling", "auto"):
        x = _vals(r, count).astype(np.float32)
        comm.all_reduce(x, algorithm=algo)
        want = sum(_vals(q, count) for q in range(P)).astype(np.float32)
        if not np.array_equal(x, want):
            bad.append(f"all_reduce {algo}: first wrong element {int(np.flatnonzero(x != want)[0])}")
    out = np.zeros(count * P, np.int64)
    out[r * count:(r + 1) * count] = _vals(r, count, 5)
    comm.all_gather(out, out[r * count:(r + 1) * count], algorithm="ring")  # input aliases output
    if not np.array_equal(out, np.concatenate([_vals(q, count, 5) for q in range(P)])):
        bad.append("all_gather in place")
    b = _vals(r, count, 9) if r == P - 1 else np.zeros(count, np.int64)
    comm.broadcast(b, root=P - 1)
    if not np.array_equal(b, _vals(P - 1, count, 9)):
        bad.append("broadcast")
    return bad


def landing_stays_in_bounds(comm):
    """Receives into a view with guard regions on both sides: a right message fills exactly the
    view; a message of another size (a mismatch the receiver reports) writes nothing at all.
    Returns (right message ok, guards intact, mismatch message or None)."""
    sub = comm.split(0, timeout=30)
    n = 300_001
    guard = 4096
    if sub.rank == 0:
        sub.send(np.arange(n, dtype=np.int64), 1)
        ok = intact = True
        try:
            sub.send(np.arange(n + 70_000, dtype=np.int64), 1)
            sub.barrier()
            err = None
        except commlib.CommError as e:
            err = f"{type(e).__name__}: {e}"
    else:
        big = np.full(n + 2 * guard, -5, np.int64)
        view = big[guard:guard + n]
        sub.recv(view, 0)
        ok = bool(np.array_equal(view, np.arange(n, dtype=np.int64)))
        intact = bool((big[:guard] == -5).all() and (big[guard + n:] == -5).all())
        view[:] = -5
        try:
            sub.recv(view, 0)
            err = None
        except commlib.MismatchError as e:
            err = str(e)
        intact &= bool((big == -5).all())  # the mismatched message landed nowhere
    sub.close()
    return ok, intact, err
