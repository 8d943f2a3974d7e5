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
    until they see it dead, then close. Returns the seconds close() took (None on the victim)."""
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
    return time.monotonic() - t
