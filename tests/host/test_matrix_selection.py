"""The selections of cases away from 3 ranks (the small counts and the large one)
(matrix_selection.py) cover what they claim, and every rank process builds the same ones."""
import itertools
import json
import os
import subprocess
import sys

import pytest

import collective_cases as cases
from matrix_selection import FULL_LARGE_AT, FULL_PRODUCT_AT, NO_LARGE_AT, covering, large_covering

HERE = os.path.dirname(os.path.abspath(__file__))
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
MOVING = ("all_gather", "all_to_all", "broadcast", "gather", "scatter")


def _rows(selection):
    """The cases of a selection, each a flat tuple: the cell's coordinates, then the value's
    (op or dtype, in place)."""
    return [cell + value for cell, values in selection.items() for value in values]


def _pairs(rows):
    return {(i, j, row[i], row[j]) for row in rows for i, j in itertools.combinations(range(len(row)), 2)}


def _full(collective, size):
    if collective in REDUCING:
        return {cell: tuple((op, ip) for op in cases.ops_for(cell[2], cell[1]) for ip in (False, True)
                            if ip is False or cell[1] < cases.LARGE)
                for cell in cases.reducing_selection(collective, size)}
    placed = {"broadcast": (True,)}.get(collective, (False, True))
    return {cell: tuple((d, ip) for d in cases.DTYPES if cases.ITEM_BYTES[d] == cell[3] and cell[0] in
                        cases.algos_for(collective, d, size) for ip in placed
                        if not (ip and cell[1] >= cases.LARGE and collective in ("all_to_all", "scatter", "gather")))
            for cell in cases.moving_selection(collective, size)}


def _split(selection):
    """(small-count part, large-count part) of a selection: the count is every cell's second coordinate."""
    return ({c: v for c, v in selection.items() if c[1] < cases.LARGE},
            {c: v for c, v in selection.items() if c[1] >= cases.LARGE})


def _selection(collective, size, thinned):
    return (cases.reducing_selection if collective in REDUCING else cases.moving_selection)(collective, size, thinned)


@pytest.mark.parametrize("collective", REDUCING + MOVING)
@pytest.mark.parametrize("size,thinned", [(1, False), (2, False), (3, False), (4, False), (5, False), (8, False),
                                          (FULL_LARGE_AT, True)])
def test_every_pair_of_the_full_product_runs(collective, size, thinned):
    selection = _selection(collective, size, thinned)
    full = _full(collective, size)
    assert list(selection) == list(full)  # every cell (algorithm x count x ...) is there
    rows, full_rows = _rows(selection), _rows(full)
    assert set(rows) <= set(full_rows)
    (small, large), (full_small, full_large) = _split(selection), _split(full)
    missing = _pairs(_rows(full_small)) - _pairs(_rows(small))
    assert not missing, f"{len(missing)} pair(s) of the full product never run, e.g. {sorted(missing)[:5]}"
    assert {cell[0] for cell in selection} == set(["auto"] + cases.algorithms_at(collective, size))
    if collective in REDUCING:
        assert {r[2] for r in rows} == set(cases.DTYPES) and {r[3] for r in rows} == set(cases.INT_OPS)
    else:
        assert {r[4] for r in rows} == set(cases.DTYPES)
    assert {r[-1] for r in rows} == {r[-1] for r in full_rows}  # in and out of place
    if size in FULL_PRODUCT_AT and not thinned:
        assert _rows(small) == _rows(full_small)
    else:
        assert len(_rows(small)) < len(_rows(full_small)) / (3 if collective in REDUCING else 1.5)
    # The large count: its full product at FULL_LARGE_AT ranks; elsewhere every algorithm (with
    # every root), dtype, op and element size meets it, in far fewer calls.
    large_rows, full_large_rows = _rows(large), _rows(full_large)
    if size == FULL_LARGE_AT and not thinned:
        assert large_rows == full_large_rows
        return
    if size in NO_LARGE_AT:  # one rank sends nothing; 5 and 8 ranks repeat 3's and 4's (matrix_selection.py)
        assert not large_rows and full_large_rows
        return
    assert len(large_rows) <= len(full_large_rows) / 2
    joint = (0,) if collective in REDUCING else (0, 2)
    for axes in [joint] + [(i,) for i in range(len(full_large_rows[0])) if i not in joint]:
        want = {tuple(r[i] for i in axes) for r in full_large_rows}
        assert {tuple(r[i] for i in axes) for r in large_rows} == want, f"large count misses some of axes {axes}"


@pytest.mark.parametrize("collective", REDUCING + MOVING)
def test_every_algorithm_meets_the_large_count_somewhere(collective):
    """Where the large count does not run (NO_LARGE_AT), every algorithm of that world size meets it
    at a world size where it does (the full product at FULL_LARGE_AT, the covering at 2 and 4)."""
    with_large = [s for s in (2, 3, 4) if s not in NO_LARGE_AT]
    assert FULL_LARGE_AT in with_large
    met = set().union(*(cases.algorithms_at(collective, s) for s in with_large))
    for size in NO_LARGE_AT:
        assert set(cases.algorithms_at(collective, size)) <= met, (size, set(cases.algorithms_at(collective, size)) - met)


def test_covering_takes_what_a_lone_cell_needs():
    """A pair that only one cell can cover is covered, beyond the cell's first value."""
    cells = [("a", 0, "x"), ("b", 0, "x")]
    values = {cells[0]: ["p", "q", "r"], cells[1]: ["p"]}
    got = covering(cells, values.__getitem__)
    assert got == {cells[0]: ("p", "q", "r"), cells[1]: ("p",)}


def test_large_covering_meets_every_value_of_every_axis():
    """Each coordinate value and each value is in a chosen case; joint axes count as one."""
    cells = [(a, r, s) for a in ("x", "y") for r in (0, 1) for s in (1, 2)]
    got = large_covering(cells, lambda cell: ["p", "q"] if cell[2] == 1 else ["r"], joint=(0, 1))
    rows = [cell + (v,) for cell, vs in got.items() for v in vs]
    assert {(r[0], r[1]) for r in rows} == {(a, r) for a in ("x", "y") for r in (0, 1)}
    assert {r[2] for r in rows} == {1, 2} and {r[3] for r in rows} == {"p", "q", "r"}
    assert len(rows) == 4


def test_the_same_selection_in_every_process():
    """Rank processes hash strings differently; the selection must not depend on it."""
    code = ("import json, collective_cases as c; print(json.dumps([[list(k), v] for coll in "
            "('all_reduce', 'reduce') for k, v in c.reducing_selection(coll, 8).items()] + "
            "[[list(k), v] for k, v in c.moving_selection('broadcast', 8).items()]))")
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed,
                   PYTHONPATH=os.pathsep.join([HERE] + sys.path))
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                   text=True, timeout=60).stdout)
    assert outs[0] == outs[1]
    mine = ([[list(k), list(v)] for coll in ("all_reduce", "reduce") for k, v in cases.reducing_selection(coll, 8).items()]
            + [[list(k), list(v)] for k, v in cases.moving_selection("broadcast", 8).items()])
    assert json.loads(outs[0]) == json.loads(json.dumps(mine))  # tuples as JSON lists
