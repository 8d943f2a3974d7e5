"""Which cases of the host collective matrix run at each world size.

At the world size FULL_PRODUCT_AT (3: odd, where the algorithms' uneven splits and remainder folds
run) every small-count case runs: algorithm x dtype x op x count x root x in or out of place. At
every other world size (1, 2, 4, 5 and 8 in CI) every algorithm x count x root still runs, with a
pairwise (strength-2) covering selection of the rest (the values: (op, placement) or (dtype,
placement)). A second full product at 4 ranks (it ran there too until issue #36) swept the matrix
twice: what it added over 4's pairwise selection is every (algorithm, dtype, op) triple again, a
property of the reduction kernels and the executor's steps, not of the world size, which the full
product at 3 holds; the power-of-two shapes (the doubling algorithms' several steps, the double
tree's mirrored second tree) run in every algorithm x count x dtype cell at 2, 4 and 8 ranks:

- reducing collectives: every algorithm x count x dtype cell runs, each with some of its dtype's
  ops and placements (the thinned dimensions);
- moving collectives (no op; bytes are moved whatever the dtype): every algorithm x count x root
  x element size (1, 2, 4, 8 bytes) cell runs, each with some of the dtypes of that size and
  placements (the thinned dimensions).

In both, every pair (a coordinate of the cell, a thinned value) that the full product holds is in
at least one case that runs: every dtype and every op appears at every world size, and every op
(dtype) meets every algorithm, count, dtype (root, element size) it meets in the full product.

The large count (~1M elements, collective_reference.BIG: the cases that take most of the matrix's
time, ~0.1 s each at 8 ranks on 2 cores) runs its full product at one world size,
FULL_LARGE_AT (3: not a power of two, so the uneven splits meet the chunking). At 2 and 4 ranks
it runs an each-choice (strength-1) covering: every algorithm (with every root, for the rooted
moving collectives), every dtype, every op and every element size meets the large count at each of
them, in a handful of calls instead of hundreds (``large_covering``). What it leaves
out there, the (algorithm, dtype) and (dtype, op) pairs at the large count, is a property of the
reduction kernels and the chunking, not of the world size: the full large product at 3 ranks and
the small counts' product (or pairwise selection) at every world size hold them.

At the world sizes NO_LARGE_AT the large count does not run at all. At one rank a call sends no
message, so there is no chunking, pipelining or split to meet it, and the local copy and reduction
of ~1M elements it would run are those the large count runs at every other world size. At 8 ranks
(issue #36: the slowest cells of the matrix, ~2 s per large call on 2 loaded cores) it would meet
the power-of-two splits and several-round doubling that 4 ranks' large calls meet, on blocks of a
prime count split unevenly as at 3 and 4: the largest count at every world size was repeated
coverage; the small counts still run every algorithm x count x root at 8. At 5 ranks (issue #36
again: a third of the matrix's time) the large count would meet what it meets at 3, in full there:
a prime world size (ring blocks of a prime count split unevenly, P-1 steps of chunked pipelining),
the non-power-of-two folds of the doubling algorithms (one rank folded in, at 3 as at 5), and a
tree with an interior rank (the double tree, the binomial trees: as at 4); no algorithm runs at 5
that does not at 2, 3 or 4 (test_matrix_selection checks). The small counts still run every algorithm x
count x root x dtype x op pair at 5, and point-to-point still moves the large count there.

The selection is greedy and deterministic: it iterates lists only (never a set: string hashing
differs between processes, and every rank must issue the same sequence of collective calls).
First each cell, in order, takes the value that covers the most pairs not covered yet (the first
in order on ties); then, while a pair is uncovered, the (cell, value) case covering the most
uncovered pairs is added.
"""
from __future__ import annotations

FULL_PRODUCT_AT = (3,)
FULL_LARGE_AT = 3
NO_LARGE_AT = (1, 5, 8)


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


def large_covering(cells, values_of, joint=(0,)):
    """{cell: values to run}: each-choice (strength-1) covering. Every value of each coordinate of
    the cells, and every value, is in at least one case that runs; the coordinates at the axes
    ``joint`` count as one (e.g. algorithm and root: every algorithm meets every root). Greedy like
    ``covering``: the case covering the most uncovered atoms is added (the first in order on ties)."""
    def atoms(cell, value):
        return ((joint, tuple(cell[axis] for axis in joint)),) + tuple(
            (axis, c) for axis, c in enumerate(cell) if axis not in joint) + (("value", value),)

    uncovered = {atom: True for cell in cells for value in values_of(cell) for atom in atoms(cell, value)}
    chosen = {cell: [] for cell in cells}
    while uncovered:
        best, best_gain = None, 0
        for cell in cells:
            for value in values_of(cell):
                if value not in chosen[cell]:
                    g = sum(1 for atom in atoms(cell, value) if atom in uncovered)
                    if g > best_gain:
                        best, best_gain = (cell, value), g
        cell, value = best
        chosen[cell].append(value)
        for atom in atoms(cell, value):
            uncovered.pop(atom, None)
    return {cell: tuple(v for v in values_of(cell) if v in chosen[cell]) for cell in cells}


def selected(world_size, cells, values_of, is_large=lambda cell: False, joint=(0,), thinned=False):
    """{cell: values to run} at ``world_size``: all of them at FULL_PRODUCT_AT ranks, else the
    pairwise covering selection; the cells where ``is_large`` holds: all of them at
    FULL_LARGE_AT ranks, none at NO_LARGE_AT ranks, else ``large_covering`` (``joint`` passed on). ``thinned``: the
    coverings at any world size (a matrix rerun under another setting, whose full product the
    default run already holds)."""
    small = [cell for cell in cells if not is_large(cell)]
    large = [cell for cell in cells if is_large(cell)]
    if world_size in FULL_PRODUCT_AT and not thinned:
        chosen = {cell: tuple(values_of(cell)) for cell in small}
    else:
        chosen = covering(small, values_of)
    if world_size == FULL_LARGE_AT and not thinned:
        chosen.update({cell: tuple(values_of(cell)) for cell in large})
    elif world_size in NO_LARGE_AT:
        chosen.update({cell: () for cell in large})
    else:
        chosen.update(large_covering(large, values_of, joint))
    return {cell: chosen[cell] for cell in cells}
