"""Rank-side case of the executor's look for a peer that failed earlier (csrc/host/peer_checks.cc)."""
from __future__ import annotations

import time

import numpy as np

import commlib


def call_after_a_peer_aborted(comm, victim):
    """`victim` aborts its communicator (publishing the failure) once every rank is past a barrier;
    the others then start an all_reduce, which must raise at once, naming the victim and the call."""
    comm.barrier()
    if comm.rank == victim:
        comm.abort("peer_checks test")
        return None
    time.sleep(0.5)  # the abort is published by now
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except commlib.CommError as e:
        return str(e), time.monotonic() - t0
    return "no error", time.monotonic() - t0
