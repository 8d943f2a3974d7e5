"""A call started after a peer failed raises at once, naming the peer and the call (the executor's
look before each call, csrc/host/peer_checks.cc), rather than waiting for the peer."""
import pytest

import peer_checks_cases as cases


@pytest.mark.timeout(120)
def test_a_call_after_a_peer_failed_raises_at_once_naming_it():
    from commlib.testing import RankPool
    pool = RankPool(3, timeout=60)
    try:
        results = pool.run(cases.call_after_a_peer_aborted, 1, timeout=60)
    finally:
        pool.kill()
    assert results[1] is None
    for q in (0, 2):
        message, took = results[q]
        assert "cannot start all_reduce" in message and "rank 1 failed earlier" in message, message
        assert "peer_checks test" in message and took < 2.0, (message, took)
