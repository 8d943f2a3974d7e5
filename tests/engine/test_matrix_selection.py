"""The selections of cases above 4 ranks (matrix_selection.py) cover every pair the full product
holds, and every rank process builds the same ones."""
import itertools
import json
import os
import subprocess
import sys

import pytest

import collective_cases as cases
from matrix_selection import FULL_PRODUCT_UP_TO, covering

HERE = os.path.dirname(os.path.abspath(__file__))
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
MOVING = ("all_gather", "all_to_all", "broadcast", "gather", "scatter")


def _rows(selection):
    return [cell + (value,) for cell, values in selection.items() for value in values]


def _pairs(rows):
    return {(i, j, row[i], row[j]) for row in rows for i, j in itertools.combinations(range(len(row)), 2)}


def _full(collective, size):
    if collective in REDUCING:
        return {cell: tuple(cases.ops_for(cell[2], cell[1])) for cell in cases.reducing_selection(collective, size)}
    return {cell: tuple(d for d in cases.DTYPES if cases.ITEM_BYTES[d] == cell[3] and cell[0] in
                        cases.algos_for(collective, d, size)) for cell in cases.moving_selection(collective, size)}


@pytest.mark.parametrize("collective", REDUCING + MOVING)
@pytest.mark.parametrize("size", [FULL_PRODUCT_UP_TO, 5, 8])
def test_every_pair_of_the_full_product_runs(collective, size):
    selection = (cases.reducing_selection if collective in REDUCING else cases.moving_selection)(collective, size)
    full = _full(collective, size)
    assert list(selection) == list(full)  # every cell (algorithm x count x ...) is there
    rows, full_rows = _rows(selection), _rows(full)
    assert set(rows) <= set(full_rows)
    missing = _pairs(full_rows) - _pairs(rows)
    assert not missing, f"{len(missing)} pair(s) of the full product never run, e.g. {sorted(missing)[:5]}"
    assert {cell[0] for cell in selection} == set(["auto"] + cases.algorithms_at(collective, size))
    if collective in REDUCING:
        assert {r[2] for r in rows} == set(cases.DTYPES) and {r[3] for r in rows} == set(cases.INT_OPS)
    else:
        assert {r[4] for r in rows} == set(cases.DTYPES)
    if size <= FULL_PRODUCT_UP_TO:
        assert rows == full_rows
    else:
        assert len(rows) < len(full_rows) / (3 if collective in REDUCING else 1.5)


def test_covering_takes_what_a_lone_cell_needs():
    """A pair that only one cell can cover is covered, beyond the cell's first value."""
    cells = [("a", 0, "x"), ("b", 0, "x")]
    values = {cells[0]: ["p", "q", "r"], cells[1]: ["p"]}
    got = covering(cells, values.__getitem__)
    assert got == {cells[0]: ("p", "q", "r"), cells[1]: ("p",)}


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
    assert json.loads(outs[0]) == mine
