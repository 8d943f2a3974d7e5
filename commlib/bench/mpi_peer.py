"""Peer: MPI through mpi4py (OpenMPI over shared memory on one host), same sweep as commlib.

Launched by ``commlib bench`` as its own job, one per run::

    mpirun [--allow-run-as-root] -np N --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
        python -m commlib.bench.launcher --backend mpi --config cfg.json --out part.json

It writes its records as JSON (rank 0) for the main bench to merge. ``available()`` says whether
mpi4py and mpirun are there, and if not, why (the report then says "MPI: not available").
"""
from __future__ import annotations

import functools
import shutil
import subprocess
import sys

import numpy as np

from commlib.bench.backends import Backend

_DTYPES = ("float32", "float64", "int8", "uint8", "int32", "int64")


def available():
    """(True, mpirun path) or (False, reason)."""
    try:
        import mpi4py  # noqa: F401
    except Exception as e:  # ImportError, or a broken libmpi
        return False, f"mpi4py not importable ({type(e).__name__}: {e})"
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        return False, "mpirun not found on PATH"
    return True, mpirun


def mpirun_command(mpirun: str, np_: int, args, backend: str = "mpi"):
    cmd = [mpirun, "-np", str(np_)]
    try:
        ver = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=10).stdout
    except Exception:
        ver = ""
    if "Open MPI" in ver or "OpenRTE" in ver:
        # Waits yield the CPU, as Open MPI does by itself when it knows the node is oversubscribed:
        # on a shared machine a spinning rank otherwise holds the core its peer needs (2 ranks, 2
        # busy cores: median 46 us, p90 28 ms per 8-byte all_reduce, against 1 us with yielding).
        cmd += ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
        import os
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
    # Every rank process enters through the launcher (it imports this module, never the reverse).
    return cmd + [sys.executable, "-m", "commlib.bench.launcher", "--backend", backend] + list(args)


class MpiBackend(Backend):
    name = "mpi"

    def __init__(self):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.transport = "shm"
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                     "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}

    @staticmethod
    def library_version():
        try:
            from mpi4py import MPI
            return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0].split(",")[0]
        except Exception:
            return None

    def supports(self, collective, mode, op, dtype):
        if dtype not in _DTYPES:
            return False
        return op in self._ops or collective not in ("all_reduce", "reduce_scatter", "reduce")

    def make(self, collective, algorithm, mode, bufs, op, root):
        c, MPI = self.comm, self.MPI
        s, r = bufs["send"], bufs["recv"]
        rop = self._ops.get(op, MPI.SUM)
        inplace = mode == "in"
        if collective == "all_reduce":
            return functools.partial(c.Allreduce, MPI.IN_PLACE if inplace else s, r, rop)
        if collective == "all_gather":
            return functools.partial(c.Allgather, MPI.IN_PLACE if inplace else s, r)
        if collective == "reduce_scatter":
            if inplace:  # MPI's in-place form leaves the block at the start of the buffer
                return functools.partial(c.Reduce_scatter_block, MPI.IN_PLACE, s, rop)
            return functools.partial(c.Reduce_scatter_block, s, r, rop)
        if collective == "all_to_all":
            return functools.partial(c.Alltoall, MPI.IN_PLACE if inplace else s, r)
        if collective == "broadcast":
            return functools.partial(c.Bcast, s, root)
        if collective == "reduce":
            snd = MPI.IN_PLACE if (inplace and self.rank == root) else s
            return functools.partial(c.Reduce, snd, r, rop, root)
        if collective == "gather":
            snd = MPI.IN_PLACE if (inplace and self.rank == root) else s
            return functools.partial(c.Gather, snd, r, root)
        if collective == "scatter":
            rcv = MPI.IN_PLACE if (inplace and self.rank == root) else r
            return functools.partial(c.Scatter, s, rcv, root)
        raise ValueError(collective)

    def barrier(self):
        self.comm.Barrier()

    def gather_stats(self, vec):
        v = np.ascontiguousarray(vec, dtype=np.float64)
        out = np.empty(v.size * self.size, np.float64)
        self.comm.Allgather(v, out)
        return out.reshape(self.size, v.size)

