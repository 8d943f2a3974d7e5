"""Rank-side cases of single-copy reads (process_vm_readv; COMMLIB_CMA, csrc/policy/single_copy.h):
whether this rank reads directly and why not, buffers that change and move between calls, and a
sender that dies with its buffer's address already published."""
from __future__ import annotations

import mmap
import os
import signal
import time

import numpy as np

import commlib
import commlib._C as _C
from commlib.testing.faults import arm_death, survivor_outcome

# 70,000 float32 = 273 KiB per block: every message of the calls below is past the 64 KiB that
# COMMLIB_CMA=1 sends single-copy, and not a multiple of a chunk.
BLOCK = 70_001


def direct_reads(comm):
    """(reads directly, the reason when not, the smallest single-copy message of a 16 MiB all_to_all)."""
    sc = _C.single_copy_min_message(_C.Collective.all_to_all, 16 << 20, comm.size)
    return comm._core.enable_direct_reads(), comm._core.direct_reads_reason(), sc


def changing_buffers(comm, rounds=6):
    """all_to_all, all_gather and broadcast on buffers that change after every call and alternate
    between two allocations (so the address a sender publishes moves too): every result must hold
    this round's values, never the previous round's or the other buffer's."""
    P, r = comm.size, comm.rank
    failures = []
    ins = [np.empty(P * BLOCK, np.float32) for _ in range(2)]
    outs = [np.empty(P * BLOCK, np.float32) for _ in range(2)]
    ramp = np.arange(BLOCK, dtype=np.float32)
    for i in range(rounds):
        x, y = ins[i % 2], outs[i % 2]
        for q in range(P):  # block q goes to rank q: value = 1000*round + 10*sender + q, plus the ramp
            x[q * BLOCK:(q + 1) * BLOCK] = ramp + (1000 * i + 10 * r + q)
        comm.all_to_all(y, x)
        want = np.concatenate([ramp + (1000 * i + 10 * q + r) for q in range(P)])
        if not np.array_equal(y, want):
            failures.append(f"all_to_all round {i} rank {r}: wrong at {int(np.argmax(y != want))}")
        comm.all_gather(y, x[:BLOCK])
        want = np.concatenate([ramp + (1000 * i + 10 * q) for q in range(P)])
        if not np.array_equal(y, want):
            failures.append(f"all_gather round {i} rank {r}: wrong at {int(np.argmax(y != want))}")
        root = i % P
        b = x[:BLOCK] if r == root else y[:BLOCK]
        if r != root:
            b[:] = -1
        comm.broadcast(b, root=root)
        if not np.array_equal(b, ramp + (1000 * i + 10 * root)):
            failures.append(f"broadcast round {i} root {root} rank {r}: wrong")
        x[:] = np.nan  # the caller reuses its input at once: peers must have finished reading it
    return failures


def in_place_all_to_all_growing(comm):
    """In-place all_to_all on buffers that grow across 2 MiB to sizes that are no multiple of it,
    with values that change every call (csrc/host/lowering.cc): `direct` sends from the caller's
    buffer and lands its receives in the communicator's scratch, copied back after the step;
    `pairwise` (several steps) sends from the private input copy. Both from 2 MiB on use whole
    2 MiB huge pages. Every result exact, never an earlier call's or a neighbour's."""
    P, r = comm.size, comm.rank
    failures = []
    for i, block in enumerate((70_001, 400_003, 70_001, 1_100_009, 600_011)):
        for algorithm in ("direct", "pairwise"):
            ramp = np.arange(block, dtype=np.float32)
            x = np.empty(P * block, np.float32)
            for q in range(P):  # block q goes to rank q: value = 1000*call + 10*sender + q, plus the ramp
                x[q * block:(q + 1) * block] = ramp + (1000 * i + 10 * r + q)
            comm.all_to_all(x, x, algorithm=algorithm)
            want = np.concatenate([ramp + (1000 * i + 10 * q + r) for q in range(P)])
            if not np.array_equal(x, want):
                failures.append(f"in-place {algorithm} all_to_all call {i} ({block} a block) rank {r}: "
                                f"wrong at {int(np.argmax(x != want))} of {x.size}")
    return failures


def sender_dies_after_publishing(comm, victim, collective="broadcast"):
    """``victim`` runs a large broadcast or all_to_all (its buffer's address goes to its peers in
    rendezvous chunks) and is SIGKILLed while it waits for their reads; the peers join the call only
    once it is dead, so their read of its memory fails: each must raise PeerError naming it and the
    call."""
    sub = comm.split(0, timeout=20)
    x = np.full(4 * BLOCK, 7.0, np.float32)
    y = np.empty_like(x)
    if collective == "broadcast":
        call = lambda: sub.broadcast(x, root=victim)  # noqa: E731
    else:  # one block of BLOCK elements (273 KiB, single-copy) per rank
        n = sub.size * BLOCK
        x, y = np.full(n, 7.0, np.float32), np.empty(n, np.float32)
        call = lambda: sub.all_to_all(y, x)  # noqa: E731
    call()  # a first call, so the second's failure is the one under test
    if arm_death(sub, victim, late_s=0):  # every peer joins late here, below
        call()
        time.sleep(10)  # the kill arrives meanwhile
        return None
    time.sleep(1.5)
    return survivor_outcome(call)


def read_after_sender_failed(comm, victim, gate):
    """A deterministic form of the race 7604be4 fixed (csrc/host/read_gate.h holds the reader): on 3
    ranks, rank 0 reads rank 1's all_to_all block single-copy, but is held at its gate once rank 1
    published the block's address; meanwhile ``victim`` (rank 2) dies, rank 1's call fails for it
    and rank 1's buffer goes away (unmapped); then rank 0 reads. Its error must name rank 2's death
    too, not only the live rank 1 it could not read. Returns each survivor's outcome (rank 1's
    carries whether its buffer was unmapped)."""
    reader, sender = 0, 1
    sub = comm.split(0, timeout=20)
    n = sub.size * BLOCK
    mem = mmap.mmap(-1, n * 4)  # the sender's input: memory of its own, so it can go away for sure
    x, y = np.frombuffer(mem, np.float32, n), np.empty(n, np.float32)
    x[:] = 7.0
    sub.all_to_all(y, x, algorithm="direct")  # a first call, so the second's failure is the one under test
    if sub.rank == reader:
        _C.hold_next_single_copy_read(sender, gate, 60.0)
        return survivor_outcome(lambda: sub.all_to_all(y, x, algorithm="direct"))
    if sub.rank == victim:  # never joins the second call: dies once the reader is held (the sender,
        _kill_self_once_exists(gate)  # waiting for its block and its read, sees it die)
        return None
    outcome = survivor_outcome(lambda: sub.all_to_all(y, x, algorithm="direct"))
    del x
    try:
        mem.close()  # munmap: the address the reader holds now reads nothing
        unmapped = True
    except BufferError:  # still referenced: the reader would read it after all (the test says so)
        unmapped = False
    os.unlink(gate)  # let the reader read
    return outcome, unmapped


def _kill_self_once_exists(path, limit_s=60.0):
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)


def gated_hierarchical_all_gather(comm, first_gate, second_gate):
    """hierarchical all_gather on one host, every block single-copy, with rank 1 held at its read of
    rank 0's block (``first_gate``) and rank 2 held at its read of rank 1's (``second_gate``): the
    test (holding rank 1) sees whether rank 1 had published its block to rank 2 before that read.
    Returns whether this rank's result is right."""
    P, r = comm.size, comm.rank
    x = np.full(BLOCK, float(r + 1), np.float32)
    y = np.empty(P * BLOCK, np.float32)
    comm.all_gather(y, x, algorithm="hierarchical")  # set up first: the call under test only reads
    if r == 1:
        _C.hold_next_single_copy_read(0, first_gate, 60.0)
        time.sleep(0.5)  # enter late: rank 0's block is published by then, so the read comes at once
    if r == 2:
        _C.hold_next_single_copy_read(1, second_gate, 60.0)
    y[:] = 0
    comm.all_gather(y, x, algorithm="hierarchical")
    return bool(np.array_equal(y, np.repeat(np.arange(1, P + 1, dtype=np.float32), BLOCK)))
