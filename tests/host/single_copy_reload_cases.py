"""Rank-side cases of the single-copy crossovers changing while calls run (policy/single_copy.h:
each plan reads its crossover once, under the table's lock; a new table bumps the tuning
generation, so every communicator drops its plans and the next call reads the new one): the next
call after a change follows it, and a thread that keeps changing the table while this rank calls
(no lock on the call's side any more) never gives a wrong result or a crash."""
from __future__ import annotations

import threading

import numpy as np

import commlib._C as _C

# 70,001 float32 = 273 KiB per block: past the 64 KiB from which a crossover sends a message
# single-copy, and not a multiple of a chunk.
BLOCK = 70_001
A2A = _C.Collective.all_to_all


def _inputs(comm, i, block=BLOCK):
    P, r = comm.size, comm.rank
    ramp = np.arange(block, dtype=np.float32)
    x = np.concatenate([ramp + (1000 * (i % 97) + 10 * r + q) for q in range(P)])
    want = np.concatenate([ramp + (1000 * (i % 97) + 10 * q + r) for q in range(P)])
    return x, want


def _count_one_call(comm, out, x, want, label, sent, wrong):
    """One all_to_all of x into out: appends the single-copy messages it sent to `sent`, and to
    `wrong` a line under `label` when out is not `want`."""
    before = comm._core.single_copy_sends()
    comm.all_to_all(out, x)
    sent.append(comm._core.single_copy_sends() - before)
    if not np.array_equal(out, want):
        wrong.append(f"{label}: wrong result")


def _crossover(comm, min_bytes, min_message=None):
    """All-to-all's crossover at this world size: min_bytes (0: every call single-copy, -1 never),
    sending messages of min_message bytes or more single-copy (None: the entry names none, 64 KiB);
    None: no single_copy entries at all."""
    if min_bytes is None:
        _C.set_single_copy_crossovers(A2A, {})
    else:
        _C.set_single_copy_crossovers(A2A, {comm.size: min_bytes},
                                      {} if min_message is None else {comm.size: min_message})


def an_entrys_smallest_message_is_followed(comm):
    """[single-copy messages this rank sent in one all_to_all of 36 KiB blocks (9,001 float32: under
    the 64 KiB default, not a multiple of a chunk) under each entry], wrong results. The entries:
    every call single-copy naming no smallest message (64 KiB: none goes), naming 32 KiB (each block
    goes), naming 40 KiB (none), naming 32 KiB for a call size just above this one (none)."""
    block = 9_001
    out = np.empty(comm.size * block, np.float32)
    sent, wrong = [], []
    call_bytes = block * 4
    entries = [(0, None), (0, 32 << 10), (0, 40 << 10), (call_bytes + 4, 32 << 10), (call_bytes, 32 << 10)]
    for i, (min_bytes, min_message) in enumerate(entries):
        _crossover(comm, min_bytes, min_message)
        _count_one_call(comm, out, *_inputs(comm, i, block), f"under {(min_bytes, min_message)}", sent, wrong)
    _crossover(comm, None)
    return sent, wrong


def next_call_follows_each_change(comm):
    """(reads directly, [single-copy messages this rank sent in one all_to_all after each change],
    wrong results). The same plan (same call) is used throughout: a plan that kept the crossover it
    was built with would send the same way after every change."""
    out = np.empty(comm.size * BLOCK, np.float32)
    sent, wrong = [], []
    for i, setting in enumerate([None, 0, -1, 0, None, 0]):
        _crossover(comm, setting)
        _count_one_call(comm, out, *_inputs(comm, i), f"after {setting}", sent, wrong)
    _crossover(comm, None)
    return comm._core.direct_reads_reason() == "", sent, wrong


def calls_while_another_thread_reloads(comm, calls=300):
    """A thread of this rank switches the crossover (every call single-copy, never, no entry) as
    fast as it can while this thread makes `calls` all_to_alls (the GIL is released in the call, so
    the two really overlap); every result must be exact. Returns (wrong results, reloads made, calls
    that went single-copy, calls that did not): both kinds of call are expected."""
    out = np.empty(comm.size * BLOCK, np.float32)
    stop = threading.Event()
    reloads = [0]

    def reload():
        settings = [0, -1, None]
        while not stop.is_set():
            _crossover(comm, settings[reloads[0] % 3])
            reloads[0] += 1

    t = threading.Thread(target=reload)
    t.start()
    wrong, single, channel = [], 0, 0
    try:
        for i in range(calls):
            x, want = _inputs(comm, i)
            before = comm._core.single_copy_sends()
            comm.all_to_all(out, x)
            if comm._core.single_copy_sends() > before:
                single += 1
            else:
                channel += 1
            if not np.array_equal(out, want):
                wrong.append(i)
    finally:
        stop.set()
        t.join()
        _crossover(comm, None)
    return wrong[:5], reloads[0], single, channel
