"""Host and device calls on one communicator: one call numbering, so mixing them differently
across ranks raises MismatchError on every rank (not a timeout), and one failure, so an engine's
PeerError aborts the host side and the other way round (rank-side code in device_mixing_cases.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_mixing_cases as cases  # noqa: E402

from emulated_pools import DELAY_ENV as ENV  # noqa: E402  (the device matrix's pools)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("after_setup", [False, True], ids=["first-device-call", "engines-set-up"])
def test_host_call_against_device_call_is_a_mismatch_on_both_ranks(pool, after_setup):
    results = pool(2, env=ENV).run(cases.host_versus_device, after_setup, timeout=60)
    for rank, ((kind, msg, took), later) in enumerate(results):
        assert kind == "MismatchError", f"rank {rank}: {kind} {msg}"
        # Both calls are named: the device one and the host one, with their number.
        assert "on device buffers" in msg and msg.count("all_reduce #") >= 2, f"rank {rank}: {msg}"
        assert took < 10, f"rank {rank} took {took:.1f} s (the timeout is 30 s)"
        assert later[0] == "MismatchError" and later[2] < 1, f"rank {rank}: later host call: {later}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", [cases.engine_failure_aborts_host, cases.host_failure_aborts_engine],
                         ids=["engine-fails-host", "host-fails-engine"])
def test_one_side_failing_fails_the_other_at_once(pool, case):
    first, second = pool(2, env=ENV).run(case, timeout=40)[0]
    assert first[0] == "PeerError" and "rank 1" in first[1], first
    assert second[0] == "PeerError" and "rank 1" in second[1], second
    assert second[2] < 0.5, f"the second call took {second[2]:.2f} s instead of raising at once"
