"""CUDA's memory rules on the emulated device (issue #23, items 7 and 9; rank side in
device_memory_rule_cases.py): no cudaFree-like free inside an enqueue while a stream is parked in
a wait, and no exported inbox freed while a peer still maps it."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_memory_rule_cases as cases  # noqa: E402

DELAY = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_TIMEOUT": "20"}


@pytest.mark.timeout(60)
def test_nccl_link_scratch_grows_without_synchronising_the_device(pool):
    """The nccl link's scratch grows inside an enqueue while rank 0's other stream is parked in a
    receive: a cudaFree there would wait for that receive (fails with free_async, checked by hand)."""
    results = pool(2, env=dict(DELAY, COMMLIB_DEVICE_LINK="nccl")).run(cases.grow_scratch_while_a_receive_waits,
                                                                         timeout=40)
    assert results == [(0, True), (0, True)]


@pytest.mark.timeout(60)
def test_exported_inbox_outlives_every_peer_mapping(pool):
    """A rank that closes late still maps its peers' inboxes: they free theirs only after the
    closing barrier (freeing without waiting for it is counted: checked by hand)."""
    assert pool(3, env=DELAY).run(cases.close_with_a_late_peer, timeout=40) == [0, 0, 0]
