"""Rank-side scenarios of host and device calls on one communicator: one call numbering (a host
call where a peer makes a device call is a mismatch) and one failure (an engine's failure aborts
the host side and the other way round). Each runs on a fresh ``comm.split``, which it aborts."""
from __future__ import annotations

import time

import numpy as np

import commlib
import commlib.emulated as emu
from commlib.testing.faults import mark_reached, wait_until_reached


def _outcome(fn):
    """(error type name, message, seconds) of fn(); ("", "", seconds) if it returned."""
    t = time.monotonic()
    try:
        fn()
    except commlib.CommError as e:
        return type(e).__name__, str(e), time.monotonic() - t
    return "", "", time.monotonic() - t


def host_versus_device(comm, after_setup):
    """Rank 0 makes a device all_reduce, rank 1 a host all_reduce of the same number. With
    ``after_setup`` both made a device call before (the engines exist); else rank 0's call is its
    first device call, waiting for rank 1's engine in the set-up rendezvous. Returns what each
    rank's call raised and whether a later host call raises at once."""
    sub = comm.split(0, timeout=30)
    x = emu.from_numpy(np.ones(16, np.float32))
    h = np.ones(16, np.float32)
    if after_setup:
        sub.all_reduce(x)
        x.numpy()
    if sub.rank == 0:
        got = _outcome(lambda: sub.all_reduce(x, async_op=True).synchronize())
    else:
        got = _outcome(lambda: sub.all_reduce(h))
    later = _outcome(lambda: sub.all_reduce(h))
    sub.close()
    return got, later


def _failure_then(comm, first, second):
    """Rank 1 stays silent after a first device call (until rank 0 is done); rank 0's `first`
    call (on the host communicator's device or host side) fails with PeerError after the timeout
    (1.5 s), then its `second` call, on the other side, raises that error at once instead of
    waiting again."""
    sub = comm.split(0, timeout=1.5)
    x = emu.from_numpy(np.ones(16, np.float32))
    sub.all_reduce(x)  # sets the engine up on both ranks
    x.numpy()
    if sub.rank == 1:
        wait_until_reached(sub, "done", [0])
        sub.close()
        return None
    calls = {"device": lambda: sub.all_reduce(x, async_op=True).synchronize(),
             "device_enqueue": lambda: sub.all_reduce(x, async_op=True),
             "host": lambda: sub.all_reduce(np.ones(4, np.float32))}
    out = (_outcome(calls[first]), _outcome(calls[second]))
    sub.close()
    mark_reached(sub, "done")
    return out


def engine_failure_aborts_host(comm):
    """A device call's PeerError makes the next host call raise it at once: (device, host)."""
    return _failure_then(comm, "device", "host")


def host_failure_aborts_engine(comm):
    """A host call's PeerError makes the next device call raise it when it is enqueued:
    (host, device)."""
    return _failure_then(comm, "host", "device_enqueue")
