"""The "shared" broadcast (one write of the root into its shared-memory stream, copied out by every
rank; csrc/host/flag_calls.cc, docs/transports.md "Flag calls"). The collective matrix runs it like
every registered algorithm (test_collectives.py, with the default stream); here: a stream far
smaller than the messages on 5 ranks (2 cores: oversubscribed), rotating roots, changing buffers and
queued async calls; roots writing their stream with plain and non-temporal stores (host/ring_stores.h);
a count mismatch; a reader and a root killed mid-copy."""
import pytest

import shared_broadcast_cases as cases
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank

TINY = {"COMMLIB_SHM_BCAST_BYTES": "256"}


def test_rotating_roots_through_a_tiny_stream(pool):
    assert pool(5).run(cases.rotating_roots_in_a_tiny_stream, timeout=120) == [[]] * 5


def test_both_kinds_of_store_into_the_stream(pool):
    assert pool(4).run(cases.both_kinds_of_store, 40 * 2, timeout=120) == [[]] * 4


def test_count_mismatch_raises(pool):
    results = pool(3).run(cases.count_mismatch, timeout=60)
    assert all(results), results
    assert results[1].startswith("MismatchError") and "broadcast stream" in results[1], results
    assert pool(3).run(cases.rotating_roots, 1, timeout=60) == [[]] * 3  # the pool's own communicator is fine


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim,root", [(2, 0), (0, 0)], ids=["reader", "root"])
def test_a_rank_killed_mid_copy_is_named(victim, root):
    results = run_killing_one_rank(3, victim, cases.killed_mid_copy, env=TINY, timeout=90, args=(root,))
    assert_survivors_named_the_dead_rank(results, victim, call="broadcast #", within_s=20)
