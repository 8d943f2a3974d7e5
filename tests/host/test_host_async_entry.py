"""Async host calls through the C++ entry (issue #37; csrc/bindings/fast_call.cc run_host): all_to_all
with split sizes, compress= calls whose codec the Python path resolved before, and every other
collective, with async_op=True, run from C++ and answer with the Python path's Work handle: no call
on the Python route, exact (and bit for bit the Python route's) at 2 and 3 ranks with awkward counts;
a wrong argument still raises naming it before anything is sent; a rank killed under an async call
is a PeerError naming it and the call on the survivors (rank side: host_async_entry_cases.py)."""
import os

import pytest

import host_async_entry_cases as cases
from a2av_argument_errors import A2AV_ARGUMENT_ERRORS
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank


@pytest.mark.timeout(120)
@pytest.mark.parametrize("P", [2, 3])
def test_async_host_all_to_all_with_splits_runs_from_the_entry(pool, P):
    for seen, runs, made, works_ok, right, same in pool(P).run(cases.async_a2av_from_the_entry, timeout=90):
        assert (seen, runs, made) == (0, 24, 24), (seen, runs, made)
        assert works_ok and right and same, (works_ok, right, same)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("P", [2, 3])
def test_async_compressed_host_calls_run_from_the_entry(pool, P):
    k = 3
    for out in pool(P).run(cases.async_compressed_from_the_entry, k, timeout=150):
        assert len(out) == 3 * 3 * 2 * 2, len(out)
        for case, seen, entry, works_ok, same in out:
            assert (seen, entry, works_ok, same) == (0, (k, k), True, True), (case, seen, entry, works_ok, same)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("P", [2, 3])
def test_async_host_collectives_run_from_the_entry(pool, P):
    for out in pool(P).run(cases.async_collectives_from_the_entry, timeout=90):
        assert [c for c, *_ in out] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                        "reduce", "gather", "scatter", "barrier"], out
        for coll, seen, runs, works_ok, same in out:
            assert (seen, runs, works_ok, same) == (0, 4, True, True), (coll, seen, runs, works_ok, same)


def test_a_wrong_async_host_argument_raises_naming_it(pool):
    want = dict(A2AV_ARGUMENT_ERRORS)
    want.update({"compress op": ("ValueError", "op:"), "compress out": ("ValueError", "out:"),
                 "compress algorithm": ("ValueError", "algorithm: unknown all_reduce algorithm 'nope'")})
    for out in pool(2).run(cases.async_bad_arguments, timeout=60):
        assert [c for c, *_ in out] == list(want), out
        for case, kind, message, runs in out:
            assert kind == want[case][0] and message.startswith(want[case][1]), (case, kind, message)
            assert runs == 0, (case, runs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,size,victim", [("a2av", 2, 1), ("a2av", 3, 0), ("compress", 3, 2)])
def test_a_rank_killed_under_an_async_entry_call_is_a_peer_error(kind, size, victim):
    before = set(os.listdir("/dev/shm"))
    results = run_killing_one_rank(size, victim, cases.kill_during_async_call, timeout=90, args=(kind,))
    # (an all_to_all with splits is a point-to-point batch on the host core numbered as a collective:
    # its error names "all_to_all #n", on either route: test_a2av_peer_errors.py)
    assert_survivors_named_the_dead_rank(results, victim, call="all_to_all #" if kind == "a2av" else "all_reduce #",
                                         within_s=30)
    leaked = [f for f in set(os.listdir("/dev/shm")) - before if "commlib" in f]
    assert not leaked, f"left in /dev/shm: {leaked}"
