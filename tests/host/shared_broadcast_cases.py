"""Rank-side cases of the "shared" broadcast (csrc/host/flag_calls.cc: the root writes the message once
into its shared-memory stream, every rank copies it out): rotating roots through a stream much
smaller than the messages (every wrap and every wait for room), buffers that change between calls,
a count mismatch, and a root or reader killed mid-copy."""
from __future__ import annotations

import os
import time

import numpy as np

import commlib
from commlib.testing.faults import arm_death, survivor_outcome

# Counts (float32) around the stream's edges under COMMLIB_SHM_BCAST_BYTES=256 (four lines): empty,
# one element, a partial line, a whole line, calls over half the ring (header and data 3 and 4 lines:
# they start at the ring's beginning, flag_calls.cc stream_start), odd counts that wrap the ring 15
# and 64 times (the matrix's ~1M-element calls cross the 64 KiB pieces of the default stream).
COUNTS = [0, 1, 13, 16, 17, 48, 1001, 4099]


def with_stream_bytes(comm, stream_bytes):
    """A communicator of the same ranks whose broadcast streams hold ``stream_bytes`` (the setting is
    read when a communicator's region is made: a split makes one), so a shared pool serves."""
    os.environ["COMMLIB_SHM_BCAST_BYTES"] = str(stream_bytes)
    try:
        return comm.split(0, timeout=30)
    finally:
        del os.environ["COMMLIB_SHM_BCAST_BYTES"]


def rotating_roots_in_a_tiny_stream(comm):
    sub = with_stream_bytes(comm, 256)
    try:
        return rotating_roots(sub)
    finally:
        sub.close()


def rotating_roots(comm, rounds=3):
    """Broadcasts of every count with the root rotating, alternating between two buffers whose
    values change every call (async calls queued back to back too): every rank must hold this
    call's root's values, never a previous call's or the other buffer's."""
    P, r = comm.size, comm.rank
    failures = []
    bufs = [np.empty(max(COUNTS), np.float32) for _ in range(2)]
    k = 0
    for i in range(rounds):
        works = []
        for n in COUNTS:
            root, b = k % P, bufs[k % 2][:n]
            want = np.arange(n, dtype=np.float32) + 1000 * k + root
            if i == rounds - 1:  # the last round queued, a buffer each: calls in flight on the worker thread
                b = np.empty(n, np.float32)
            b[:] = want if r == root else -1
            if i == rounds - 1:
                works.append((k, root, b, want, comm.broadcast(b, root=root, algorithm="shared", async_op=True)))
            else:
                comm.broadcast(b, root=root, algorithm="shared")
                if not np.array_equal(b, want):
                    failures.append(f"call {k} (count {n}, root {root}) on rank {r}: wrong at {int(np.argmax(b != want))}")
            k += 1
        for k_, root, b, want, w in works:
            w.wait()
            if not np.array_equal(b, want):
                failures.append(f"async call {k_} (root {root}) on rank {r}: wrong at {int(np.argmax(b != want))}")
        comm.barrier()
    return failures[:5]


def count_mismatch(comm):
    """Rank 1 broadcasts 3 elements, the others 2, root 0, through the stream of a communicator split
    for it (a failed communicator stays failed): rank 1 finds the root's header naming another call
    and raises MismatchError; the others raise at their next call; nobody hangs."""
    sub = comm.split(0, timeout=30)
    x = np.zeros(3 if sub.rank == 1 else 2, np.float32)
    try:
        sub.broadcast(x, root=0, algorithm="shared")
        sub.barrier()
        return None
    except commlib.CommError as e:
        return type(e).__name__ + (": " + str(e) if sub.rank == 1 else "")
    finally:
        sub.close()


def killed_mid_copy(comm, victim, root):
    """A broadcast of 64 MiB through a 256-byte stream (about 350,000 pieces: the root waits for its
    readers' room at every one) from ``root``; ``victim`` is SIGKILLed 0.3 s into it, so it dies
    mid-copy. Every survivor must raise PeerError naming it and the call."""
    x = np.ones(16 << 20, np.float32)
    comm.broadcast(x[:1000], root=root, algorithm="shared")  # the pool is up: the kill hits the next
    if arm_death(comm, victim, late_s=0):  # nobody late: the root's stream is slow enough
        comm.broadcast(x, root=root, algorithm="shared")
        time.sleep(30)  # the kill arrives meanwhile
        return None
    return survivor_outcome(lambda: comm.broadcast(x, root=root, algorithm="shared"))


def both_kinds_of_store(comm, calls=40):
    """Broadcasts of several 64 KiB pieces each, values changing every call, from each root in turn:
    the root measures plain and non-temporal stores into its stream and writes each piece with one
    of them (host/ring_stores.h: plain first, one piece non-temporal the next call, then the better
    kind, probing the other every 16 calls), so both kinds land here whatever the placement. Every
    rank must hold exactly this call's values."""
    P, r = comm.size, comm.rank
    n = (5 * 65536 + 4100) // 4  # five whole pieces and a partial one
    failures = []
    x = np.empty(n, np.float32)
    base = np.arange(n, dtype=np.float32)
    for k in range(calls):
        root = (k // 8) % P  # 8 calls a root: its choice settles, then probes
        want = base + 7 * k + root
        x[:] = want if r == root else -1
        comm.broadcast(x, root=root, algorithm="shared")
        if not np.array_equal(x, want):
            failures.append(f"call {k} (root {root}) on rank {r}: wrong at {int(np.argmax(x != want))}")
    return failures
