"""Rank-side cases of the shared-memory flag calls (auto's small broadcast and barrier on one
host, csrc/host/flag_calls.cc): barrier ordering, a broadcast whose ranks disagree on the count,
and a root that dies before it writes (and so never arrives at a barrier)."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np

import commlib
from commlib.testing.faults import survivor_outcome


def barrier_orders(comm, path, rounds=200):
    """Every rank stores round i in its cell of a shared file, then barriers: after the barrier no
    cell may still hold an earlier round (a barrier that let a rank through early would show it)."""
    P, r = comm.size, comm.rank
    cells = np.memmap(path, dtype=np.int64, mode="r+", shape=(P,))
    late = []
    for i in range(1, rounds + 1):
        cells[r] = i
        comm.barrier()
        if int(cells.min()) < i:
            late.append(f"round {i}: rank {r} saw {cells.tolist()}")
        comm.barrier()  # nobody starts round i + 1 before everyone checked round i
    return late[:3]


def broadcast_count_mismatch(comm):
    """Rank 1 broadcasts 3 elements, the others 2 (root 0): rank 1 raises MismatchError; the root
    does not wait for its readers, so it and the other reader may return and raise at their next
    call (a barrier), as with the channels. Nobody hangs."""
    x = np.zeros(3 if comm.rank == 1 else 2, np.float32)
    try:
        comm.broadcast(x, root=0)
        comm.barrier()
        return None
    except commlib.CommError as e:
        return type(e).__name__ + (": " + str(e) if comm.rank == 1 else "")


def root_dies_before_writing(comm, victim):
    """``victim`` (the root) is SIGKILLed before its broadcast; the others wait on its slot and must
    raise PeerError naming it and the call. Then each survivor enters a flag barrier of ``comm``
    (the victim is one of its ranks too, and never arrives): PeerError naming it and the barrier."""
    sub = comm.split(0, timeout=20)
    x = np.ones(4, np.float32)
    sub.broadcast(x, root=victim)
    comm.barrier()
    if sub.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait(0.2)
    return survivor_outcome(lambda: sub.broadcast(x, root=victim)), survivor_outcome(comm.barrier)


def broadcast_rotating_roots(comm, calls=100):
    """``calls`` flag broadcasts, the root rotating and the count and values changing every call, a
    barrier every 7th: each reader finds every root's k-th write in that root's slot k mod slots
    (every root wraps its ring at least twice at 5 ranks), never an older or another root's write.
    Returns the wrong calls seen by this rank (empty: all right)."""
    P, r = comm.size, comm.rank
    wrong = []
    for i in range(calls):
        root = i % P
        n = 1 + (i * 37) % 2048  # 4 B .. 8 KiB of float32: every size the flags take
        want = np.arange(n, dtype=np.float32) + 1000 * i
        x = want.copy() if r == root else np.full(n, -1, np.float32)
        comm.broadcast(x, root=root)
        if not np.array_equal(x, want):
            wrong.append(f"call {i} (root {root}, {n} elements): rank {r} got {x[:3].tolist()}...")
        if i % 7 == 6:
            comm.barrier()
    # Then one root far ahead: the last rank starts reading late, so root 0 fills its ring and
    # must wait for it before it writes a slot again (never over a write not yet read).
    if r == P - 1:
        threading.Event().wait(0.05)
    for i in range(calls):
        want = np.full(2, i, np.float32)
        x = want.copy() if r == 0 else np.full(2, -1, np.float32)
        comm.broadcast(x, root=0)
        if not np.array_equal(x, want):
            wrong.append(f"run-ahead call {i}: rank {r} got {x.tolist()}")
    # What the bench reports auto ran: the flags up to 8 KiB and for barrier, the schedule above.
    from commlib.bench.backends import CommlibBackend
    from commlib.core.call_spec import COLLECTIVE
    runs = {(c, n): comm._core.auto_runs_flag_call(COLLECTIVE[c], n)
            for c, n in (("broadcast", 8192), ("broadcast", 8193), ("barrier", 0), ("all_reduce", 8), ("reduce", 8))}
    if runs != {("broadcast", 8192): True, ("broadcast", 8193): False, ("barrier", 0): True,
                ("all_reduce", 8): True, ("reduce", 8): False}:  # (all_reduce: flag_exchange_cases.py)
        wrong.append(f"auto_runs_flag_call: {runs}")
    label = CommlibBackend(comm).resolve("broadcast", "auto", 8, "float32")
    if label != "flags":
        wrong.append(f"the bench says auto's 8-byte broadcast ran {label}")
    return wrong[:4]
