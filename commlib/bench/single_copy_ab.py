"""Single-copy reads off and on in one job: ``commlib bench --single-copy both``.

`commlib tune` finds from which call size single-copy reads (process_vm_readv, one copy) beat the
channels (two copies) per collective and world size (single_copy_tuning.py). It used to compare
two jobs, one run with COMMLIB_CMA=0 and one with COMMLIB_CMA=1, minutes apart, on buffers each
job's own history had placed (on huge pages or not, which a peer's read of them depends on): a
slow spell of the machine during one job, or buffers placed differently, decided the crossover
(bench/RESULTS_collectives.md session 24: why it never gave the 2 MiB all_to_all crossover that
session 23 set by hand from CPU per call). Here each rank makes sub-communicators of its own
communicator, one set up with COMMLIB_CMA=0 and one per side that is on (COMMLIB_CMA=16K, 32K and 1:
the smallest message sent single-copy; read once when a communicator is made), and the sweep times
every algorithm through each, ``<algorithm>@cma0``, ``<algorithm>@cma32K``, ..., in the same rounds on
the same buffers. The run's records then carry every side; `commlib tune` reads them as that many
runs would be read (``split_records``).
"""
from __future__ import annotations

from commlib import settings
from commlib.bench.backends import CommlibBackend

# COMMLIB_CMA of each sub-communicator: channels only, single-copy from 16, 32 and 64 KiB messages
# (`commlib tune` picks the smallest message of each entry among them: 64 KiB lost a 32 KiB all_to_all
# message's gain on the Intel Xeon VMs, session 35)
SIDES = ("0", "16K", "32K", "1")


def variant(algorithm: str, side: str) -> str:
    return f"{algorithm}@cma{side}"


def parse(name: str):
    """"ring@cma1" -> ("ring", "1"); any other name -> (name, None)."""
    algo, _, tail = name.rpartition("@cma")
    if algo and tail in SIDES:
        return algo, tail
    return name, None


class SingleCopyBackend(CommlibBackend):
    """commlib's algorithms through a sub-communicator per side: single-copy reads off, and on from
    each smallest message."""

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
    """Records of such runs as `commlib tune` reads separate runs: ``ring@cma1`` becomes ``ring`` with
    ``single_copy`` "1" (and likewise every side); other records are returned as they are."""
    out = []
    for r in records:
        algo, side = parse(r.get("algorithm", ""))
        out.append(r if side is None else dict(r, algorithm=algo, single_copy=side))
    return out
