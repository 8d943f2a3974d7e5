"""Mesh: one communicator per parallelism dimension, in the order [TP, CP, PP, DP].

TP is innermost (its ranks are neighbours: they talk most, per layer), then CP (per attention
layer), PP (per micro-batch, point-to-point) and DP outermost (once per step):

    rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank

Each dimension's communicator groups the ranks that differ only in that coordinate, built with
``comm.split``; the existing layers take them unchanged (TinyGPT's ``groups={"tp", "cp"}``,
``DataParallel(module, mesh.dp)``, ``ZeroOptimizer(..., mesh.dp)``, ``PipelineStage(..., mesh.pp)``).
"""
from __future__ import annotations

from typing import Dict

__all__ = ["Mesh", "DIMS"]

DIMS = ("tp", "cp", "pp", "dp")


class Mesh:
    """Split ``comm`` into tensor-, context-, pipeline- and data-parallel communicators.

    Collective over ``comm``. ``tp * cp * pp * dp`` must equal ``comm.size``. Attributes
    ``tp``, ``cp``, ``pp``, ``dp`` are the communicators (size-1 dimensions get a one-rank
    communicator, so code need not special-case them); ``coords`` this rank's coordinates.
    """

    def __init__(self, comm, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1):
        sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
        for name, n in sizes.items():
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"{name}: must be a positive int, got {n!r}")
        total = tp * cp * pp * dp
        if total != comm.size:
            raise ValueError(f"mesh sizes tp={tp} x cp={cp} x pp={pp} x dp={dp} = {total} do not multiply "
                             f"to the communicator's size {comm.size}")
        self.sizes = sizes
        self.comm = comm
        self.coords = self.coords_of(comm.rank)
        self._groups: Dict[str, object] = {}
        for dim in DIMS:
            # The ranks sharing every other coordinate form this dimension's group, ordered by it.
            colour = self._flat({d: (0 if d == dim else c) for d, c in self.coords.items()})
            self._groups[dim] = comm.split(colour, self.coords[dim])

    def coords_of(self, rank: int) -> Dict[str, int]:
        """The (tp, cp, pp, dp) coordinates of a rank of ``comm``."""
        out = {}
        for dim in DIMS:
            out[dim] = rank % self.sizes[dim]
            rank //= self.sizes[dim]
        return out

    def rank_of(self, **coords) -> int:
        """The rank of ``comm`` at the given coordinates (missing ones are 0)."""
        return self._flat({d: coords.get(d, 0) for d in DIMS})

    def _flat(self, coords: Dict[str, int]) -> int:
        rank = 0
        for dim in reversed(DIMS):
            rank = rank * self.sizes[dim] + coords[dim]
        return rank

    @property
    def tp(self):
        return self._groups["tp"]

    @property
    def cp(self):
        return self._groups["cp"]

    @property
    def pp(self):
        return self._groups["pp"]

    @property
    def dp(self):
        return self._groups["dp"]

    def close(self):
        """Close the dimension communicators (not ``comm``)."""
        for g in self._groups.values():
            g.close()
        self._groups = {}

    def __repr__(self):
        s = self.sizes
        return f"Mesh(tp={s['tp']}, cp={s['cp']}, pp={s['pp']}, dp={s['dp']}; rank {self.comm.rank} at {self.coords})"
