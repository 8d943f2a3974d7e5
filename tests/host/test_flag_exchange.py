"""auto's small all_gather, all_to_all, all_reduce and reduce_scatter on one host go through the
shared-memory flags (each rank's input written once into its slot, read by every rank;
csrc/host/flag_calls.cc, docs/transports.md "Flag calls"): every dtype, op, placement and count up
to the slot's (and one past it, back on the schedule) at 1-5 and 8 ranks, each world size in one
pool; the tuned cutoffs; a count mismatch; a dead rank; slot rings wrapped by ranks running ahead, between broadcasts."""
import pytest

import flag_exchange_cases as cases
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank
from test_collectives import _check_identical


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_every_dtype_op_count_and_placement_of_the_flag_exchanges(pool, size):
    results = pool(size).run(cases.exchange_matrix, timeout=240)
    failures = [f for fails, _ in results for f in fails]
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:20])
    _check_identical([d for _, d in results])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [1, 3, 4])
def test_the_tuned_cutoffs_decide_up_to_which_size_auto_takes_the_flags(pool, size):
    assert pool(size).run(cases.tuned_cutoffs, timeout=60) == [[]] * size


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective", ["all_reduce", "all_gather"])
def test_ranks_that_disagree_on_the_count_all_raise_mismatch(collective):
    # (all_gather: rank 1 passes 0 elements and has nothing to take; it still raises.) The message
    # names the flags, the route the call took, not the schedule auto would have run.
    from commlib.testing import RankPool
    pool = RankPool(3, timeout=60)
    try:
        results = pool.run(cases.disagreeing_counts, collective, timeout=60)
        assert all(r and r.startswith("MismatchError") and f"{collective} #" in r and "(flags," in r
                   for r in results), results
    finally:
        pool.kill()


@pytest.mark.timeout(120)
def test_a_rank_dead_before_its_exchange_is_named_by_every_survivor():
    results = run_killing_one_rank(3, 1, cases.dies_before_writing, timeout=60)
    assert_survivors_named_the_dead_rank(results, 1, call="all_gather #", within_s=20)


@pytest.mark.timeout(180)
def test_slot_rings_wrap_between_broadcasts_with_a_late_rank(pool):
    assert pool(5).run(cases.wrapping_rings, timeout=150) == [[]] * 5
