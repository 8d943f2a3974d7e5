"""Errors, one matrix on the host route and on the device route (the stream engine on emulated
device arrays): bad arguments refused before sending, mismatched calls, dead and silent peers, leaks
(rank side: error_cases.py; each route's own part: error_routes.py)."""
import os

import pytest

import error_cases as cases
from emulated_pools import DELAY_ENV  # tests/: the device matrix's pools
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank

# The pool environment of each route: device calls run with a delay on every data operation, so
# that a call returns before its data is ready.
ENV = {"host": {}, "device": DELAY_ENV}


@pytest.mark.parametrize("route,size", [("host", 2), ("host", 3), ("device", 3)])
def test_bad_arguments_raise_before_sending(pool, route, size):
    assert pool(size, env=ENV[route]).run(cases.bad_arguments, route) == [[]] * size


MISMATCHES = [(route, size, scenario) for route, size in (("host", 2), ("host", 3), ("device", 3))
              for scenario in ("collective", "count", "dtype", "algorithm", "root")] + [
    ("host", size, scenario) for size in (2, 3) for scenario in ("codec", "codec_vs_none")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route,size,scenario", MISMATCHES)
def test_mismatch_raises_on_every_rank(pool, route, size, scenario):
    results = pool(size, env=ENV[route]).run(cases.mismatch, scenario, route, timeout=90)
    for rank, (msg, took, later, names) in enumerate(results):
        assert msg is not None, f"rank {rank} got no error"
        assert "wrong type" not in msg, msg
        assert all(n in msg for n in names), f"rank {rank}: message does not name both calls: {msg}"
        assert took < 20, f"rank {rank} took {took:.1f} s to detect the mismatch"
        assert later is not None and later < 1.0, f"rank {rank}: aborted communicator did not fail at once"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route,size,victim,within_s", [("host", 2, 1, 30), ("host", 3, 0, 30), ("host", 4, 2, 30),
                                                        ("device", 2, 1, 20), ("device", 3, 0, 20)])
def test_killed_peer_raises_peer_error(route, size, victim, within_s):
    before = set(os.listdir("/dev/shm"))
    results = run_killing_one_rank(size, victim, cases.kill_during_collective, env=ENV[route], timeout=90,
                                   args=(route,))
    assert_survivors_named_the_dead_rank(results, victim, within_s=within_s)
    leaked = [f for f in set(os.listdir("/dev/shm")) - before if "commlib" in f]
    assert not leaked, f"left in /dev/shm: {leaked}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("route,size", [("host", 3), ("device", 2)])
def test_silent_peer_times_out(pool, route, size):
    """The waiting ranks' calls fail after the timeout, naming rank 1 and the call (the device
    route's message names the setting too); their buffers are usable again; rank 1's late call
    fails at once."""
    res = pool(size, env=ENV[route]).run(cases.silent_peer, route, timeout=40)
    timeout = cases.route(route).SILENT_TIMEOUT
    for rank in [q for q in range(size) if q != 1]:
        msg, took = res[rank]
        words = ("rank 1", "all_reduce") + cases.route(route).TIMEOUT_WORDS
        assert all(w in msg for w in words), msg
        assert timeout - 0.5 < took < 10, took
    msg, took = res[1]
    assert msg.startswith(("PeerError", "CommError")) and took < 1.0, (msg, took)


@pytest.mark.timeout(60)
def test_a_waiting_rank_in_the_call_is_not_blamed_for_the_silent_one(pool):
    # Rank 2 waits on rank 0 from the start; rank 0, 0.6 s late, waits on the silent rank 1 (a
    # schedule of waits, error_cases._wait_chain; recursive doubling at 3 ranks is such a chain, where
    # CI once saw rank 2 blame rank 0). Rank 2's timeout comes first, on a rank that is in the call: it
    # waits for rank 0's verdict (a second timeout at most), so both name rank 1 (host/executor.cc on_idle).
    res = pool(3).run(cases.silent_peer_late_waiter, timeout=40)
    for rank in (0, 2):
        msg, took = res[rank]
        assert "rank 1 did not answer" in msg and "all_reduce" in msg, (rank, msg)
        assert took < 10, (rank, took)


@pytest.mark.parametrize("route,size", [("host", 3), ("device", 2)])
def test_no_thread_fd_mapping_or_device_memory_leaks(pool, route, size):
    for before, after in pool(size, env=ENV[route]).run(cases.resources, route):
        assert after == before, f"(threads, fds, held) before {before}, after {after}"


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
