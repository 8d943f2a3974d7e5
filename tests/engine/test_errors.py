"""Errors: bad arguments refused before sending, mismatched calls, dead and silent peers, leaks."""
import os

import pytest

import error_cases as cases
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank


@pytest.mark.parametrize("size", [2, 3])
def test_bad_arguments_raise_before_sending(pool, size):
    assert pool(size).run(cases.bad_arguments) == [[]] * size


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["collective", "count", "dtype", "algorithm", "root"])
@pytest.mark.parametrize("size", [2, 3])
def test_mismatch_raises_on_every_rank(pool, size, scenario):
    for rank, (msg, took, later, names) in enumerate(pool(size).run(cases.mismatch, scenario, timeout=90)):
        assert msg is not None, f"rank {rank} got no error"
        assert "wrong type" not in msg, msg
        assert all(n in msg for n in names), f"rank {rank}: message does not name both calls: {msg}"
        assert took < 20, f"rank {rank} took {took:.1f} s to detect the mismatch"
        assert later is not None and later < 1.0, f"rank {rank}: aborted communicator did not fail at once"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size,victim", [(2, 1), (3, 0), (4, 2)])
def test_killed_peer_raises_peer_error(size, victim):
    before = set(os.listdir("/dev/shm"))
    results = run_killing_one_rank(size, victim, cases.kill_during_collective)
    assert_survivors_named_the_dead_rank(results, victim, within_s=30)
    leaked = [f for f in set(os.listdir("/dev/shm")) - before if "commlib" in f]
    assert not leaked, f"left in /dev/shm: {leaked}"


@pytest.mark.timeout(60)
def test_silent_peer_times_out(pool):
    res = pool(3).run(cases.silent_peer, timeout=40)
    for rank in (0, 2):
        msg, took = res[rank]
        assert "rank 1" in msg and "all_reduce" in msg and "did not answer" in msg, msg
        assert 1.5 < took < 10, took
    msg, took = res[1]
    assert msg.startswith(("PeerError", "CommError")) and took < 1.0, (msg, took)


def test_no_thread_fd_or_mapping_leaks(pool):
    for before, after in pool(3).run(cases.resources):
        assert after == before, f"(threads, fds, mappings) before {before}, after {after}"


def test_closed_communicator_refuses_calls(pool):
    assert all("closed" in m for m in pool(2).run(cases.closed_use))


@pytest.mark.parametrize("size", [1, 4, 5])
def test_split(pool, size):
    res = pool(size).run(cases.split_groups)
    for rank, (sub_rank, sub_size, total, none) in enumerate(res):
        members = [q for q in range(size) if q % 2 == rank % 2]
        assert sub_size == len(members)
        assert sub_rank == sorted(members, reverse=True).index(rank)
        assert total == sum(members)
        assert none == (rank == 0)
