"""Which cases of the host collective matrix run at each world size.

Up to FULL_PRODUCT_UP_TO ranks every case runs: algorithm x dtype x op x count x root (x in or
out of place). Above it (5 and 8 ranks in CI: the slow end of the matrix on 2 cores) every
algorithm x count x root still runs, with a pairwise (strength-2) covering selection of the rest:

- reducing collectives: every algorithm x count x dtype cell runs, each with some of its dtype's
  ops (the ops are the thinned dimension);
- moving collectives (no op; bytes are moved whatever the dtype): every algorithm x count x root
  x element size (1, 2, 4, 8 bytes) cell runs, each with some of the dtypes of that size (the
  dtypes are the thinned dimension).

In both, every pair (a coordinate of the cell, a thinned value) that the full product holds is in
at least one case that runs: every dtype and every op appears at every world size, and every op
(dtype) meets every algorithm, count, dtype (root, element size) it meets in the full product.

The selection is greedy and deterministic: it iterates lists only (never a set: string hashing
differs between processes, and every rank must issue the same sequence of collective calls).
First each cell, in order, takes the value that covers the most pairs not covered yet (the first
in order on ties); then, while a pair is uncovered, the (cell, value) case covering the most
uncovered pairs is added.
"""
from __future__ import annotations

FULL_PRODUCT_UP_TO = 4


def _pairs(cell, value):
    return tuple((axis, coordinate, value) for axis, coordinate in enumerate(cell))


def covering(cells, values_of):
    """{cell: values to run} for ``cells`` (tuples of coordinates), where ``values_of(cell)``
    lists the values the full product runs in that cell; see the module docstring."""
    uncovered = {}  # dict, not set: insertion-ordered and only used for membership
    for cell in cells:
        for value in values_of(cell):
            for pair in _pairs(cell, value):
                uncovered[pair] = True
    chosen = {cell: [] for cell in cells}

    def gain(cell, value):
        return sum(1 for pair in _pairs(cell, value) if pair in uncovered)

    def take(cell, value):
        chosen[cell].append(value)
        for pair in _pairs(cell, value):
            uncovered.pop(pair, None)

    for cell in cells:
        values = list(values_of(cell))
        if values:
            take(cell, max(values, key=lambda v: (gain(cell, v), -values.index(v))))
    while uncovered:
        best, best_gain = None, 0
        for cell in cells:
            for value in values_of(cell):
                if value not in chosen[cell]:
                    g = gain(cell, value)
                    if g > best_gain:
                        best, best_gain = (cell, value), g
        take(*best)
    return {cell: tuple(v for v in values_of(cell) if v in chosen[cell]) for cell in cells}


def selected(world_size, cells, values_of):
    """{cell: values to run} at ``world_size``: all of them up to FULL_PRODUCT_UP_TO ranks, else
    the pairwise covering selection."""
    if world_size <= FULL_PRODUCT_UP_TO:
        return {cell: tuple(values_of(cell)) for cell in cells}
    return covering(cells, values_of)
