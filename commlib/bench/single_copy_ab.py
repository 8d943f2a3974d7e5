"""Single-copy reads off and on in one job: ``commlib bench --single-copy both``.

`commlib tune` finds from which call size single-copy reads (process_vm_readv, one copy) beat the
channels (two copies) per collective and world size (single_copy_tuning.py). It used to compare
two jobs, one run with COMMLIB_CMA=0 and one with COMMLIB_CMA=1, minutes apart, on buffers each
job's own history had placed (on huge pages or not, which a peer's read of them depends on): a
slow spell of the machine during one job, or buffers placed differently, decided the crossover
(bench/RESULTS_collectives.md session 24: why it never gave the 2 MiB all_to_all crossover that
session 23 set by hand from CPU per call). Here each rank makes two sub-communicators of its own
communicator, one set up with COMMLIB_CMA=0 and one with COMMLIB_CMA=1 (read once when a
communicator is made), and the sweep times every algorithm through both, ``<algorithm>@cma0`` and
``<algorithm>@cma1``, in the same rounds on the same buffers. The run's records then carry both
sides; `commlib tune` reads them as two runs would be read (``split_records``).
"""
from __future__ import annotations

from commlib import settings
from commlib.bench.backends import CommlibBackend

SIDES = ("0", "1")  # COMMLIB_CMA of each sub-communicator: channels only, single-copy from 64 KiB


def variant(algorithm: str, side: str) -> str:
    return f"{algorithm}@cma{side}"


def parse(name: str):
    """"ring@cma1" -> ("ring", "1"); any other name -> (name, None)."""
    algo, _, tail = name.rpartition("@cma")
    if algo and tail in SIDES:
        return algo, tail
    return name, None


class SingleCopyBackend(CommlibBackend):
    """commlib's algorithms through two sub-communicators, single-copy reads off and on."""

    def __init__(self, comm):
        super().__init__(comm)
        self.sides = {}
        for side in SIDES:
            with settings.overridden({"COMMLIB_CMA": side}):
                self.sides[side] = CommlibBackend(comm.split(0))

    def algorithms(self, collective):
        return [variant(a, s) for a in super().algorithms(collective) for s in SIDES]

    def compressible(self, collective, algorithm, codec):
        return False  # --compress is not compared across the two sides

    def make(self, collective, algorithm, mode, bufs, op, root):
        algo, side = parse(algorithm)
        return self.sides[side].make(collective, algo, mode, bufs, op, root)

    def resolve(self, collective, algorithm, size, dtype):
        algo, side = parse(algorithm)
        return self.sides[side].resolve(collective, algo, size, dtype)

    def extra_info(self, cfg):
        """Why each side's single-copy reads are off ('' when on): the JSON shows the sides differ."""
        return {"single_copy_sides": {s: b.comm._core.direct_reads_reason() for s, b in self.sides.items()}}

    def close(self):
        for b in self.sides.values():
            try:
                b.comm.close()
            except Exception:
                pass


def split_records(records):
    """Records of such runs as `commlib tune` reads two runs: ``ring@cma1`` becomes ``ring`` with
    ``single_copy`` "1" (and likewise "0"); other records are returned as they are."""
    out = []
    for r in records:
        algo, side = parse(r.get("algorithm", ""))
        out.append(r if side is None else dict(r, algorithm=algo, single_copy=side))
    return out
