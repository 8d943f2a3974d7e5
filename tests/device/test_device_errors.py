"""The stream engine's semantics across ranks: stream order, works, bad arguments, mismatches,
dead and silent peers, leaks (rank-side code in device_error_cases.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_error_cases as cases  # noqa: E402
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

ENV = {"COMMLIB_EMULATED_DELAY_US": "20"}


def test_call_returns_before_data_is_ready_and_stream_order_holds(pool):
    assert pool(2, env=ENV).run(cases.stream_order) == [(True, True), (True, True)]


def test_work_wait_orders_another_stream(pool):
    assert pool(2, env=ENV).run(cases.work_wait_orders_another_stream) == [True, True]


@pytest.mark.parametrize("size", [3, 4])
def test_async_calls_on_two_streams_complete_in_order(pool, size):
    assert pool(size, env=ENV).run(cases.many_async_calls) == [[]] * size


def test_bad_arguments_raise_before_enqueueing(pool):
    assert pool(3, env=ENV).run(cases.bad_arguments) == [[]] * 3


@pytest.mark.timeout(90)
@pytest.mark.parametrize("scenario", ["collective", "count", "dtype", "root"])
def test_mismatch_raises_on_every_rank(pool, scenario):
    for rank, (msg, took, later, names) in enumerate(pool(3, env=ENV).run(cases.mismatch, scenario, timeout=60)):
        assert msg is not None, f"rank {rank} got no error"
        assert "wrong type" not in msg, msg
        assert all(n in msg for n in names), f"rank {rank}: message does not name both calls: {msg}"
        assert took < 20, f"rank {rank} took {took:.1f} s"
        assert later is not None and later < 1.0, f"rank {rank}: aborted communicator did not fail at once"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size,victim", [(2, 1), (3, 0)])
def test_killed_peer_raises_peer_error(size, victim):
    results = run_killing_one_rank(size, victim, cases.kill_during_collective, env=ENV, timeout=60)
    assert_survivors_named_the_dead_rank(results, victim, within_s=20)


@pytest.mark.timeout(60)
def test_silent_peer_times_out_and_releases_the_stream(pool):
    res = pool(2, env=ENV).run(cases.silent_peer, timeout=40)
    msg, took = res[0]
    assert "rank 1" in msg and "all_reduce" in msg and "COMMLIB_TIMEOUT" in msg, msg
    assert 1.0 < took < 10, took
    assert res[1][0].startswith(("PeerError", "CommError")), res[1]


def test_no_thread_fd_or_device_memory_leaks(pool):
    for before, after in pool(2, env=ENV).run(cases.resources):
        assert after == before, (before, after)
