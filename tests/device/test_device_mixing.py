"""Host and device calls on one communicator: one call numbering, so mixing them differently
across ranks raises MismatchError on every rank (not a timeout), and one failure, so an engine's
PeerError aborts the host side and the other way round (rank-side code in device_mixing_cases.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_mixing_cases as cases  # noqa: E402

ENV = {"COMMLIB_EMULATED_DELAY_US": "20"}


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
def test_engine_failure_aborts_the_host_side(pool):
    device, host = pool(2, env=ENV).run(cases.engine_failure_aborts_host, timeout=40)[0]
    assert device[0] == "PeerError" and "rank 1" in device[1], device
    assert host[0] == "PeerError" and "rank 1" in host[1], host
    assert host[2] < 0.5, f"the host call waited {host[2]:.2f} s instead of raising at once"


@pytest.mark.timeout(60)
def test_host_failure_aborts_the_engine(pool):
    host, device = pool(2, env=ENV).run(cases.host_failure_aborts_engine, timeout=40)[0]
    assert host[0] == "PeerError" and "rank 1" in host[1], host
    assert device[0] == "PeerError" and "rank 1" in device[1], device
    assert device[2] < 0.5, f"the device call took {device[2]:.2f} s to raise"
