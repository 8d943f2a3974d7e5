"""Rank-side cases of test_store_outlives_rank0.py: a job built with ``commlib.init()`` inside a
pool (rank 0 serving the store in its process, or every rank a client of a ``commlib store``
process named by COMMLIB_STORE); rank 0 is SIGKILLed, the survivors shrink."""
from __future__ import annotations

import os
import signal
import time

import numpy as np

import commlib
from commlib.errors import PeerError
from commlib.bootstrap.ports import free_port


def _job(comm, prefix: str, store_address: str = "", secret: str = ""):
    """A communicator of the pool's ranks built by plain ``commlib.init()``: through the store
    ``store_address`` names (COMMLIB_STORE), else through one rank 0 serves on a free port."""
    if secret:
        os.environ["COMMLIB_SECRET"] = secret
    if store_address:
        os.environ["COMMLIB_STORE"] = store_address
        return commlib.init(rank=comm.rank, world_size=comm.size, prefix=prefix, timeout=30)
    port = np.zeros(1, np.int64)
    if comm.rank == 0:
        port[0] = free_port()
    comm.broadcast(port, root=0)
    return commlib.init(rank=comm.rank, world_size=comm.size, master_addr="127.0.0.1", master_port=int(port[0]),
                        prefix=prefix, timeout=30)


def _lose_rank0(job):
    """Rank 0 dies (SIGKILL) between two all_reduces; the others see PeerError naming it."""
    x = np.ones(8)
    job.all_reduce(x)
    assert x[0] == job.size
    if job.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        job.all_reduce(x)
    except PeerError as e:
        assert "rank 0" in str(e), str(e)
    else:
        raise AssertionError("all_reduce completed without rank 0")


def case_rank0_store(comm, victim):
    """Rank 0 serves the store: returns (error class, message, seconds) of each survivor's shrink."""
    assert victim == 0
    job = _job(comm, "rank0-store")
    try:
        _lose_rank0(job)
        start = time.monotonic()
        try:
            job.shrink()
        except Exception as e:  # noqa: BLE001 - returned for the test to inspect
            return type(e).__name__, str(e), time.monotonic() - start
        return None, "shrink succeeded", time.monotonic() - start
    finally:
        job.close()


def case_external_store(comm, victim, address, secret):
    """Every rank a client of the ``commlib store`` at ``address``: after rank 0's death the
    survivors shrink and go on with collectives and store traffic (a split). Returns the new
    (rank, size), an all_reduce's result and a split child's."""
    assert victim == 0
    job = _job(comm, "external-store", address, secret)
    smaller = child = None
    try:
        _lose_rank0(job)
        smaller = job.shrink()
        x = np.full(16, comm.rank, np.int64)
        for _ in range(3):
            smaller.all_reduce(x)
        child = smaller.split(0, key=-smaller.rank)  # a rendezvous through the store, ranks reversed
        y = np.array([smaller.rank], np.int64)
        child.all_reduce(y)
        return (smaller.rank, smaller.size), int(x[0]), (child.rank, int(y[0]))
    finally:
        for c in (child, smaller, job):
            if c is not None:
                c.close()
