"""close() of a communicator with device engines when a peer was SIGKILLed (rank-side code in
device_close_cases.py): the closing barrier, where every rank says it closed its imports of the
others' memory before any frees its own, stops waiting for a rank the control plane sees dead
(before: up to 30 s, min(COMMLIB_TIMEOUT, 30)); and an engine's set-up stops waiting for a dead rank's
handle (before: COMMLIB_TIMEOUT)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_close_cases as cases  # noqa: E402
from commlib.testing.faults import run_killing_one_rank  # noqa: E402


@pytest.mark.timeout(90)
def test_close_does_not_wait_for_a_killed_peer():
    results = run_killing_one_rank(3, 1, cases.close_after_peer_killed, env={"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_TIMEOUT": "60"},
                                   timeout=60)
    assert results[1] is None
    for rank in (0, 2):
        closing, first_call, took = results[rank]
        assert closing < 5, f"rank {rank}'s close() took {closing:.1f} s"
        # The first device call after the kill: its engine set-up names the dead rank at once
        # (before: waited out COMMLIB_TIMEOUT, 60 s, then said rank 1 never made its first call).
        assert first_call.startswith("PeerError: all_reduce") and "rank 1 is gone" in first_call, first_call
        assert took < 5, f"rank {rank}'s first device call took {took:.1f} s to fail: {first_call}"
