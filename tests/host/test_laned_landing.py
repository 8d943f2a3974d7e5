"""Laned calls land large receives over TCP in their destination (docs/DESIGN.md "Laned calls",
session 28): rail_ring's channels give each directed pair one lane, so where the chunks that come next
from a peer can only be one receive's, the executor posts it to the link (TCP writes the payload
straight into the destination) instead of copying every chunk out of the link's ring, the lanes'
second copy that list order never paid. 4 ranks on 2 emulated hosts (the pool of test_laned_calls.py):
rail_ring's all_gather, reduce_scatter and all_reduce with messages over TCP past 64 KiB, exact and
bitwise equal to list order, and bytes landed during the laned calls (0 before session 28: checked by
hand with the post left out).
"""
import pytest

import laned_cases as cases
from test_laned_calls import env_for


@pytest.mark.timeout(180)
def test_laned_receives_land_in_place(pool):
    results = pool(4, env=env_for(4)).run(cases.laned_landing, timeout=150)
    failures = [f for fails, _, _ in results for f in fails]
    assert not failures, "\n".join(failures[:20])
    assert all(lanes == {c: 2 for c in cases.LANDING_COUNTS} for _, _, lanes in results), results
    # Every rank receives over TCP from its rail peer on the other host; a message posted only once its
    # step runs lands whatever has not come yet (all of it, or its later chunks), so some of every
    # collective's plain receives land: all_gather's all, reduce_scatter's none (it only reduces),
    # all_reduce's all-gather half.
    for collective in ("all_gather", "all_reduce"):
        assert sum(landed[collective] for _, landed, _ in results) > 0, (collective, results)
    assert sum(landed["reduce_scatter"] for _, landed, _ in results) == 0, results
