"""commlib and Open MPI in the same rank processes, their calls interleaved at every size.

Why: the machines this project measures on have slow spells. On the 2-core VMs a cache line
handed from one core to the other takes about 90 ns there and back, and for minutes at a time
about 390 ns (most likely the host placing the VM's cores apart; bench/RESULTS_collectives.md, session 24).
Calls whose time is hand-offs between the cores (32 KiB-512 KiB here) are then 2-3.5x slower,
whoever runs them (commlib or Open MPI).
When commlib and MPI run as separate jobs, a spell during one job and not the other decides their
ratio (session 23's run 3: every commlib reduce_scatter row from 32 KiB to 512 KiB 2-3x its
value in runs 1 and 2, Open MPI's not). Here one ``mpirun`` starts the ranks, each rank sets up
commlib's communicator (its store on MASTER_ADDR:MASTER_PORT, its ranks from OMPI_COMM_WORLD_*)
beside MPI's, and the sweep times ``mpi`` as one more series of each round (sweep.py), in its
comparison mode (common.COMPARE_MODE), on the same buffers: a spell now hits both alike.

``commlib bench`` does this whenever MPI is a peer on one host (``--peer-jobs same``, the default);
``--peer-jobs separate`` runs MPI as a job of its own, as before. gloo keeps its own job: its calls
are 10-300x commlib's, so a spell does not decide its ratios, and its torch set-up would add
seconds to every commlib job.
"""
from __future__ import annotations

from commlib.bench.backends import Backend
from commlib.perf import common as C

INLINE = "commlib+mpi"  # the launcher's --backend for such a job


class SameJobBackend(Backend):
    """commlib's backend with MPI's series beside its algorithms (``mpi``, backend ``mpi``)."""

    name = "commlib"

    def __init__(self, commlib_backend, mpi_backend):
        self.cl, self.mpi = commlib_backend, mpi_backend
        self.rank, self.size = self.cl.rank, self.cl.size
        if (self.mpi.rank, self.mpi.size) != (self.rank, self.size):
            raise RuntimeError(f"same-job bench: MPI rank {self.mpi.rank}/{self.mpi.size} is commlib rank "
                               f"{self.rank}/{self.size}: both must number the processes alike")
        self.transport = self.cl.transport
        self.comm = self.cl.comm  # rank_process._close closes it

    def algorithms(self, collective):
        return self.cl.algorithms(collective)

    def peers_inline(self, collective):
        return ["mpi"]

    def supports(self, collective, mode, op, dtype):
        return self.cl.supports(collective, mode, op, dtype)

    def runs(self, collective, algorithm, mode, op, dtype):
        if algorithm == "mpi":
            return mode == C.COMPARE_MODE[collective] and self.mpi.supports(collective, mode, op, dtype)
        return True

    def compressible(self, collective, algorithm, codec):
        return self.cl.compressible(collective, algorithm, codec)

    def make(self, collective, algorithm, mode, bufs, op, root):
        if algorithm == "mpi":
            return self.mpi.make(collective, algorithm, mode, bufs, op, root)
        return self.cl.make(collective, algorithm, mode, bufs, op, root)

    def barrier(self):
        self.cl.barrier()

    def gather_stats(self, vec):
        return self.cl.gather_stats(vec)

    def resolve(self, collective, algorithm, size, dtype):
        return algorithm if algorithm == "mpi" else self.cl.resolve(collective, algorithm, size, dtype)

    def backend_of(self, algorithm):
        return "mpi" if algorithm == "mpi" else "commlib"

    def transport_of(self, algorithm):
        return self.mpi.transport if algorithm == "mpi" else self.transport

    def extra_info(self, cfg):
        f = getattr(self.cl, "extra_info", None)  # e.g. --single-copy-ab's sides
        return f(cfg) if callable(f) else {}

    def close(self):
        f = getattr(self.cl, "close", None)  # its sub-communicators (--single-copy-ab), before its own
        if callable(f):
            f()


def split_parts(got):
    """A same-job part's records and infos per backend: ({backend: [records]}, {backend: info})."""
    info = dict(got["info"])
    infos = {"mpi": info.pop("inline_mpi", {"available": False, "reason": "no MPI info in the job's part"}),
             "commlib": info}
    records = {"commlib": [], "mpi": []}
    for r in got["records"]:
        records.setdefault(r["backend"], []).append(r)
    return records, infos
