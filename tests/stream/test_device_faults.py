"""A sticky device error in the middle of collectives (issue #23's acceptance; rank side in
device_fault_cases.py): the faulted rank raises CommError, its peers PeerError within
COMMLIB_TIMEOUT, close() returns on every rank, no process aborts, and no rank broke a CUDA rule
the emulated device checks (no device call from a host function, no stray context)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_fault_cases as cases  # noqa: E402

TIMEOUT_S = 8
ENV = {"COMMLIB_TIMEOUT": str(TIMEOUT_S), "COMMLIB_EMULATED_DELAY_US": "5"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size,victim", [(2, 1), (4, 2)])
def test_injected_fault_is_comm_error_here_and_peer_error_there(pool, size, victim):
    results = pool(size, env=ENV).run(cases.fault_in_collectives, victim, timeout=90)
    for rank, r in enumerate(results):
        assert r["ok_before"], (rank, r)
        assert r["error"] is not None, (rank, r)
        kind, msg = r["error"]
        if rank == victim:
            assert kind == "CommError" and "cudaErrorIllegalAddress" in msg, (rank, r)
        else:
            assert kind == "PeerError" and f"rank {victim}" in msg, (rank, r)
            assert r["raised_after"] < TIMEOUT_S + 5, (rank, r)
        assert r["close_s"] < 35, (rank, r)
        assert r["rules"]["host_function_violations"] == 0, (rank, r["rules"])
        assert r["rules"]["stray_contexts"] == 0, (rank, r["rules"])


@pytest.mark.timeout(60)
def test_mismatch_found_in_a_host_function_makes_no_device_call_there(pool):
    """Issue #23 item 2: the descriptor check's host function only records the mismatch; the
    watchdog acts on it (before, it failed the engine from the host function: an event query and
    ncclCommAbort there, which CUDA forbids)."""
    for rank, (error, rules) in enumerate(pool(2, env=ENV).run(cases.mismatch_rules, timeout=40)):
        assert error == "MismatchError", (rank, error)
        assert rules["host_function_violations"] == 0, (rank, rules)
