"""A rank killed under an all_to_all with split sizes on host buffers (issue #37, session 27): the
call is a point-to-point batch on the host core, numbered as a collective
(Communicator::all_to_allv), so the survivors' PeerError names the dead rank and ``all_to_all #n``
with its call number, as every collective's error does, not the batch's ``send #n``: through the
C++ entry and the Python route, blocking and async, at 3 ranks (rank side: a2av_peer_error_cases.py;
the entry's async form at 2 and 3 ranks also in test_host_async_entry.py)."""
import os

import pytest

import a2av_peer_error_cases as cases
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route,async_op,victim", [("entry", False, 1), ("python", False, 2), ("python", True, 0)])
def test_a_rank_killed_under_an_all_to_all_with_splits_is_named_with_the_call(route, async_op, victim):
    before = set(os.listdir("/dev/shm"))
    results = run_killing_one_rank(3, victim, cases.kill_during_all_to_allv, timeout=90, args=(route, async_op))
    for rank, res in enumerate(results):
        if rank != victim and res is not None and len(res) == 3:
            assert res[2] == route, f"rank {rank}: the call went {res[2]!r}, not {route!r}: {res[0]}"
    assert_survivors_named_the_dead_rank([r and r[:2] for r in results], victim, call="all_to_all #3 (",
                                         within_s=30)
    for rank, res in enumerate(results):
        if rank != victim:
            assert "send #" not in res[0] and f"rank {rank}" in res[0], res[0]
    leaked = [f for f in set(os.listdir("/dev/shm")) - before if "commlib" in f]
    assert not leaked, f"left in /dev/shm: {leaked}"
