"""A rank killed under an all_to_all with split sizes on device buffers (issue #37, session 27): the
call is the stream engine's point-to-point batch, numbered as a collective
(StreamEngine::all_to_allv), so every survivor's PeerError names the dead rank and
``all_to_all #n`` with its call number, as every collective's error does, not one of the batch's
messages (``send #n``): through the C++ entry and the Python route, blocking and async, at 3 ranks
on the emulated device, after host and device calls interleaved on the one communicator agreed on
their numbers (rank side: device_a2av_peer_error_cases.py; the host form:
tests/host/test_a2av_peer_errors.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_a2av_peer_error_cases as cases  # noqa: E402

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

# Long enough that a survivor's error within WITHIN_S comes from the watchdog seeing the death,
# never from the timeout.
TIMEOUT_S = 60
WITHIN_S = 30
ENV = {"COMMLIB_TIMEOUT": str(TIMEOUT_S), "COMMLIB_EMULATED_DELAY_US": "5"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route,async_op,victim", [("entry", False, 1), ("entry", True, 2), ("python", False, 0),
                                                   ("python", True, 1)])
def test_a_rank_killed_under_a_device_all_to_all_with_splits_is_named_with_the_call(route, async_op, victim):
    before = set(os.listdir("/dev/shm"))
    results = run_killing_one_rank(3, victim, cases.kill_during_device_all_to_allv, env=ENV, timeout=90,
                                   args=(route, async_op))
    for rank, res in enumerate(results):
        if rank != victim and res is not None and len(res) == 4:
            assert res[3], f"rank {rank}: the calls before the kill gave wrong results"
            assert res[2] == route, f"rank {rank}: the call went {res[2]!r}, not {route!r}: {res[0]}"
    assert_survivors_named_the_dead_rank([r and r[:2] for r in results], victim,
                                         call=f"all_to_all #{cases.KILLED_CALL} (", within_s=WITHIN_S)
    for rank, res in enumerate(results):
        if rank != victim:
            assert "send #" not in res[0] and f"rank {rank}" in res[0], res[0]
    leaked = [f for f in set(os.listdir("/dev/shm")) - before if "commlib" in f]
    assert not leaked, f"left in /dev/shm: {leaked}"
