"""The kernel path's protocols and plan cache on the emulated device (rank side in
kernel_protocol_cases.py), in the 2-rank pool of the device matrix (test_device_collectives.py's
DELAY_ENV: the stream delay on, both ranks on emulated device 0):

* LL-sized chunks take the LL protocol and larger ones the slots, by the kernel's own record
  (bypassing LL, or LL taking large chunks, fails it);
* crossing the LL flags' epoch (2^32 - 1 chunks of a pair, started just before it through the
  test hook) moves the right data: a flag taken modulo 2^32, or a receiver that does not scrub the
  slot at the epoch's end, takes a line left from the chunk 2^32 (or 2^32 - 1) earlier;
* evicting the cached plans (the 257th call shape) inside an enqueue while another stream of the
  device is parked in a receive frees them in stream order, not with a device-wide (cudaFree-like)
  free."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_protocol_cases as cases  # noqa: E402
from kernel_path_cases import KERNEL_SETTINGS  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402


@pytest.mark.timeout(60)
def test_small_chunks_take_ll_and_larger_ones_the_slots(pool):
    # 2 ranks, direct all_reduce: per call each rank sends one chunk and receives one.
    with_ll = pool(2, env=DELAY_ENV).run(cases.chunks_by_protocol, KERNEL_SETTINGS, timeout=40)
    assert with_ll == [[(2, 0, True), (0, 2, True)]] * 2, with_ll
    without = pool(2, env=DELAY_ENV).run(cases.chunks_by_protocol, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_LL_BYTES="0"),
                                         timeout=40)
    assert without == [[(0, 2, True), (0, 2, True)]] * 2, without


@pytest.mark.timeout(90)
def test_crossing_the_ll_flag_epoch_moves_the_right_data(pool):
    assert pool(2, env=DELAY_ENV).run(cases.cross_the_ll_epoch, timeout=60) == [[], []]


@pytest.mark.timeout(90)
def test_plan_eviction_frees_in_stream_order(pool):
    results = pool(2, env=DELAY_ENV).run(cases.evict_plans_while_a_receive_waits, timeout=60)
    assert results == [(0, True, True), (0, True, True)], results
