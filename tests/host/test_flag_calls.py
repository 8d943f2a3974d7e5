"""auto's small broadcast and barrier on one host go through the shared-memory flags (one write
read by every rank; csrc/host/flag_calls.cc, docs/transports.md "Flag calls"). Their results are
checked by the collective matrix (test_collectives.py: broadcast's small counts and barrier run
with auto); here: barrier ordering on 5 ranks (oversubscribed), broadcasts of rotating roots wrapping every
root's slot ring, a root far ahead of a late reader, a count mismatch, a dead root (and so a rank
missing from a barrier)."""
import numpy as np
import pytest

import flag_cases as cases
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank


def test_barrier_lets_nobody_through_early(pool, tmp_path):
    path = str(tmp_path / "cells")
    np.zeros(5, np.int64).tofile(path)
    assert pool(5).run(cases.barrier_orders, path, timeout=120) == [[]] * 5


def test_broadcasts_of_rotating_roots_read_each_roots_ring(pool):
    assert pool(5).run(cases.broadcast_rotating_roots, timeout=120) == [[]] * 5


@pytest.mark.timeout(120)
def test_broadcast_count_mismatch_raises_everywhere():
    from commlib.testing import RankPool
    pool = RankPool(3, timeout=60)
    try:
        results = pool.run(cases.broadcast_count_mismatch, timeout=60)
        assert all(results), results
        assert results[1].startswith("MismatchError") and "broadcast #" in results[1] and "(flags," in results[1], results
    finally:
        pool.kill()


@pytest.mark.timeout(120)
def test_a_dead_rank_is_named_by_a_flag_broadcast_and_a_flag_barrier():
    results = run_killing_one_rank(3, 2, cases.root_dies_before_writing, timeout=60)
    assert results[2] is None, results
    assert_survivors_named_the_dead_rank([r and r[0] for r in results], 2, call="broadcast #", within_s=20)
    assert_survivors_named_the_dead_rank([r and r[1] for r in results], 2, call="barrier #", within_s=20)
