"""Rank-side cases of test_device_close.py: closing a communicator whose device engines were set
up, after a peer was SIGKILLed between calls (nothing in flight, so no engine failed)."""
import os
import signal
import time

import numpy as np

import commlib.emulated as emu
from commlib.core.shrink import gone_ranks


def close_after_peer_killed(comm, victim):
    """``victim`` dies (SIGKILL) after a device all_reduce completed everywhere; the survivors wait
    until they see it dead, then close; then they make the pool communicator's first device call,
    whose engine set-up waits for the dead rank. Returns (seconds close() took, the first call's
    error, seconds it took) (None on the victim)."""
    sub = comm.split(0, timeout=60)
    x = emu.from_numpy(np.ones(1024, np.float32))
    sub.all_reduce(x)
    x.numpy()
    sub.barrier()  # every rank's device call completed: nothing is in flight, no engine fails
    if sub.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
    deadline = time.monotonic() + 20
    while victim not in gone_ranks(sub) and time.monotonic() < deadline:
        time.sleep(0.01)
    t = time.monotonic()
    sub.close()
    closing = time.monotonic() - t
    # The pool's communicator has made no device call yet: its first one sets up an engine, whose
    # rendezvous waits for every rank's handle. The dead rank never gives one: the wait must stop
    # once the control plane sees it gone, not after COMMLIB_TIMEOUT (60 s here).
    t = time.monotonic()
    try:
        comm.all_reduce(emu.from_numpy(np.ones(8, np.float32)))
        first_call = "no error"
    except Exception as e:  # noqa: BLE001 - reported to the test
        first_call = f"{type(e).__name__}: {e}"
    return closing, first_call, time.monotonic() - t
