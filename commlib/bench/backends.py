"""What the sweep drives: the ``Backend`` interface and commlib's own backend.

A backend builds a zero-argument callable per call shape (``functools.partial`` of the collective,
so the timed loop is ``fn()`` between two ``perf_counter`` reads) and offers ``barrier`` and
``gather_stats`` (an all_gather of a small float64 vector, outside the timed region). gloo's is in
gloo_peer.py, MPI's in mpi_peer.py, the device bench's in device.py.
"""
from __future__ import annotations

import functools

import numpy as np

from commlib.perf import common as C

class Backend:
    """Interface of the objects the sweep drives (see CommlibBackend for the reference one)."""

    name = "?"
    transport = "?"
    rank = 0
    size = 1

    def algorithms(self, collective):
        """Algorithm names to measure for ``collective`` when the user asked for ``all``."""
        return [self.name]

    def supports(self, collective, mode, op, dtype):
        return True

    def compressible(self, collective, algorithm, codec) -> bool:
        """Whether ``algorithm`` of ``collective`` runs with compress=``codec`` (--compress)."""
        return False

    def make(self, collective, algorithm, mode, bufs, op, root):
        """Zero-argument callable running one collective on ``bufs`` (see make_buffers)."""
        raise NotImplementedError

    def barrier(self):
        raise NotImplementedError

    def gather_stats(self, vec: np.ndarray) -> np.ndarray:
        """(size, len(vec)) float64: every rank's ``vec``."""
        raise NotImplementedError

    def resolve(self, collective, algorithm, size, dtype):
        """The algorithm that really runs (for ``auto``)."""
        return algorithm

    def peers_inline(self, collective):
        """Other backends' series measured in these same rank processes, interleaved with this
        backend's algorithms in every round (same_job.py); none by default."""
        return []

    def runs(self, collective, algorithm, mode, op, dtype) -> bool:
        """Whether the sweep times ``algorithm`` in ``mode`` (every mode the plan chose, by default)."""
        return True

    def backend_of(self, algorithm) -> str:
        """The backend a record of ``algorithm`` belongs to (the report's column)."""
        return self.name

    def transport_of(self, algorithm) -> str:
        return self.transport


class CommlibBackend(Backend):
    """commlib's own collectives on a Communicator."""

    name = "commlib"

    def __init__(self, comm):
        import commlib
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self._commlib = commlib
        self.transport = _transport_of(comm)

    def algorithms(self, collective):
        return list(self._commlib.algorithms(collective)) + ["auto"]

    def supports(self, collective, mode, op, dtype):
        return not (collective == "broadcast" and mode == "out")

    def compressible(self, collective, algorithm, codec):
        from commlib.core import codecs
        if collective not in codecs.COMPRESSIBLE:
            return False
        if algorithm == "auto":
            return True
        try:  # what the verifier proves on this host map (the calls refuse the rest)
            codecs.verify(collective, algorithm, self.size, 97, host_of=list(self.comm.topology.host_of),
                          inter_only=codec.endswith(":inter"))
            return True
        except (self._commlib.VerificationError, ValueError):
            return False

    def make(self, collective, algorithm, mode, bufs, op, root):
        algorithm, _, codec = algorithm.partition("+")
        if codec:
            return self._make_compressed(collective, algorithm, mode, bufs, op, codec)
        c, s, r = self.comm, bufs["send"], bufs["recv"]
        scale = C.PREMUL_SCALE if op == "premul_sum" else None
        if collective == "all_reduce":
            return functools.partial(c.all_reduce, s, op, algorithm, None if mode == "in" else r,
                                     False, scale)
        if collective == "all_gather":
            return functools.partial(c.all_gather, r, s, algorithm)
        if collective == "reduce_scatter":
            return functools.partial(c.reduce_scatter, r, s, op, algorithm, False, scale)
        if collective == "all_to_all":
            return functools.partial(c.all_to_all, r, s, algorithm)
        if collective == "broadcast":
            return functools.partial(c.broadcast, s, root, algorithm)
        if collective == "reduce":
            return functools.partial(c.reduce, s, root, op, algorithm, None if mode == "in" else r,
                                     False, scale)
        if collective == "gather":
            return functools.partial(c.gather, r, s, root, algorithm)
        if collective == "scatter":
            return functools.partial(c.scatter, r, s, root, algorithm)
        raise ValueError(collective)

    def _make_compressed(self, collective, algorithm, mode, bufs, op, codec):
        from commlib.core.codecs import Codec
        name, _, flag = codec.partition(":")
        kw = {"algorithm": algorithm, "compress": Codec(name, inter_only=flag == "inter")}
        c, s, r = self.comm, bufs["send"], bufs["recv"]
        if collective == "all_reduce":
            return functools.partial(c.all_reduce, s, op, out=None if mode == "in" else r, **kw)
        if collective == "all_gather":
            return functools.partial(c.all_gather, r, s, **kw)
        return functools.partial(c.reduce_scatter, r, s, op, **kw)

    def barrier(self):
        self.comm.barrier()

    def gather_stats(self, vec):
        vec = np.ascontiguousarray(vec, dtype=np.float64)
        out = np.empty(vec.size * self.size, np.float64)
        self.comm.all_gather(out, vec, "ring")
        return out.reshape(self.size, vec.size)

    def resolve(self, collective, algorithm, size, dtype):
        if "+" in algorithm:  # compress=: auto runs ring, or hierarchical for inter_only across hosts
            algorithm, _, codec = algorithm.partition("+")
            hosts = len(set(self.comm.topology.host_of))
            return algorithm if algorithm != "auto" else (
                "hierarchical" if codec.endswith(":inter") and 1 < hosts < self.size else "ring")
        if algorithm != "auto":
            return algorithm
        from commlib.core.call_spec import COLLECTIVE
        nbytes = C.core_bytes(collective, size, dtype, self.size)
        try:  # the communicator's own choice: it knows the link kinds (hierarchical across hosts)
            core = self.comm._core
            if core.auto_runs_flag_call(COLLECTIVE[collective], nbytes):
                return "flags"  # one shared-memory write, not a schedule (docs/transports.md "Flag calls")
            return core.auto_choice(COLLECTIVE[collective], nbytes, C.elem_size(dtype))  # as the call resolves
        except Exception:
            pass
        try:
            import commlib._C as _C
            return _C.choose_algorithm(COLLECTIVE[collective], "auto", nbytes, self.size)
        except Exception:
            return "auto"


def _transport_of(comm) -> str:
    """The link kinds of the job ("shm", "tcp", "shm+tcp"), from the topology: shm where a host
    holds several ranks, tcp between hosts (the same on every rank, whatever its own links)."""
    try:
        host_of = list(comm.topology.host_of)
        kinds = (["shm"] if len(set(host_of)) < len(host_of) else []) + (["tcp"] if len(set(host_of)) > 1 else [])
        if kinds:
            return "+".join(kinds)
    except Exception:  # a communicator without a topology (e.g. a test double): older attributes
        pass
    for obj in (comm, getattr(comm, "_core", None)):
        t = getattr(obj, "transport", None)
        if callable(t):
            try:
                t = t()
            except Exception:
                t = None
        if isinstance(t, str) and t:
            return t
    return "shm"
