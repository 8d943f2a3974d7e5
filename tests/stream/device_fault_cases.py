"""Rank-side scenario of a device fault in the middle of collectives (issue #23's acceptance):
``commlib.emulated.inject_fault`` makes one rank's device sticky-failed like a CUDA context after an
illegal address. That rank must raise CommError, the others PeerError within COMMLIB_TIMEOUT, and
close() must return everywhere. Runs on emulated device 7, so the pool's device 0 stays healthy."""
from __future__ import annotations

import time

import numpy as np

import commlib
import commlib.emulated as emu

DEVICE = 7


def fault_in_collectives(comm, victim, calls=40):
    sub = comm.split(0, device=f"emulated:{DEVICE}")
    s = emu.Stream(DEVICE)
    x = emu.from_numpy(np.ones(1 << 15, np.float32), device_index=DEVICE, stream=s)
    for _ in range(3):
        sub.all_reduce(x, stream=s)
    s.synchronize()
    ok_before = bool((x.numpy() == comm.size ** 3).all())
    comm.barrier()  # every rank is through its first calls
    if comm.rank == victim:
        emu.inject_fault(DEVICE, "illegal_address")
    t0 = time.monotonic()
    error = None
    try:
        for _ in range(calls):
            sub.all_reduce(x, stream=s)
        sub.all_reduce(x, stream=s, async_op=True).synchronize()
    except commlib.CommError as e:
        error = (type(e).__name__, str(e))
    raised_after = time.monotonic() - t0
    t1 = time.monotonic()
    sub.close()
    close_s = time.monotonic() - t1
    return {"ok_before": ok_before, "error": error, "raised_after": raised_after, "close_s": close_s,
            "rules": emu.rule_counts()}


def mismatch_rules(comm):
    """A count mismatch (10 against 11 elements) found by the call-descriptor check, whose host
    function may only record it: MismatchError on every rank, and no device or NCCL call from a
    host function (the rule counts)."""
    sub = comm.split(0, device="emulated:0")
    x = emu.from_numpy(np.ones(10 + comm.rank, np.float32))
    error = None
    try:
        sub.all_reduce(x, async_op=True).synchronize()
    except commlib.CommError as e:
        error = type(e).__name__
    sub.close()
    return error, emu.rule_counts()
