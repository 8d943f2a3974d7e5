"""Point-to-point on device buffers through the stream engine: send/recv, batches and all_to_all
with splits, stream-ordered with the emulated delay on, counts 0 to several chunks, uneven splits,
and a mismatched pair raising MismatchError (rank-side code in device_p2p_cases.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_p2p_cases as cases  # noqa: E402

from emulated_pools import DELAY_ENV as ENV  # noqa: E402  (the device matrix's pools)


@pytest.mark.parametrize("size", [2, 3])
def test_ring_shift_send_recv(pool, size):
    assert pool(size, env=ENV).run(cases.ring_shift) == [[]] * size


@pytest.mark.parametrize("size", [2, 4])
def test_fan_out_and_batch_gather(pool, size):
    assert pool(size, env=ENV).run(cases.fan_out_and_in) == [[]] * size


@pytest.mark.parametrize("size", [1, 3, 4])
def test_all_to_all_with_uneven_splits(pool, size):
    assert pool(size, env=ENV).run(cases.all_to_all_uneven) == [[]] * size


@pytest.mark.timeout(60)
def test_mismatched_pair_raises_on_both(pool):
    (k0, m0), (k1, m1) = pool(2, env=ENV).run(cases.mismatched_pair, timeout=40)
    assert k1 == "MismatchError" and "10 x float32" in m1 and "11 x float32" in m1, (k1, m1)
    assert k0 == "MismatchError", (k0, m0)


@pytest.mark.timeout(60)
def test_mismatched_receive_raises_though_it_completes_before_the_watchdog(pool):
    results = pool(2, env={"COMMLIB_EMULATED_DELAY_US": "0"}).run(cases.mismatched_pair_already_there, 16, timeout=40)
    for rank, rounds in enumerate(results):
        for i, res in enumerate(rounds):
            assert res is not None and res[0] == "MismatchError", (rank, i, res)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("receiver_on_device,first", [(True, False), (False, False), (True, True)],
                         ids=["host-to-device", "device-to-host", "host-to-device-first-device-call"])
def test_host_message_against_device_message_is_a_mismatch_on_both(pool, receiver_on_device, first):
    # One numbering per pair for host and device messages: a host send where the receiver expects
    # a device message (or the other way round) is found in well under the 30 s timeout, also
    # while the receive, as the first device call, waits for the peers' engines.
    results = pool(2, env=ENV).run(cases.host_against_device, receiver_on_device, first, timeout=40)
    for rank, res in enumerate(results):
        assert res is not None, f"rank {rank} got no error"
        kind, msg, took = res
        assert kind == "MismatchError", (rank, kind, msg)
        assert "rank 0" in msg and "rank 1" in msg and "on device buffers" in msg and "10 x float32" in msg, (rank, msg)
        assert took < 5, (rank, took)
