"""The kernel path's grid against the device's resident blocks (issue #38, item 4), on the emulated
device with COMMLIB_EMULATED_RESIDENT_BLOCKS=1 for the pool (blocks beyond the limit wait until
resident ones finish, as on a GPU). Rank side in occupancy_cases.py.

* a call that wants every block (split items) on a device holding one runs on one block, with the
  right result (a grid of 4 leaves 3 blocks waiting for the one that waits for them: a hang until
  the timeout);
* two ranks sharing a device that holds one block leave none for each: COMMLIB_DEVICE_PATH=kernel
  refuses at set-up with a message that says why, auto takes the copy path on every rank;
* two communicators' kernels on one device, one held at a gate on one rank, complete: the launch
  chain orders them (without it each rank's device holds a different communicator's kernel, each
  waiting for its peer)."""
import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import occupancy_cases as cases  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

# A machine of its own (COMMLIB_EMULATED_MACHINE): the devices' resident blocks are shared by every
# process of a machine, and a concurrent run of these tests elsewhere on this host is another one.
ENV = dict(DELAY_ENV, COMMLIB_EMULATED_RESIDENT_BLOCKS="1", COMMLIB_EMULATED_MACHINE=f"occ{uuid.uuid4().hex[:12]}")


@pytest.mark.timeout(120)
def test_a_grid_larger_than_the_device_is_sized_to_fit(pool):
    assert pool(2, env=ENV).run(cases.sized_to_fit, timeout=90) == [(True, 1, "kernel")] * 2


@pytest.mark.timeout(120)
def test_no_block_left_per_rank_refuses_the_kernel_path_or_takes_the_copy_path(pool):
    for message, auto in pool(2, env=ENV).run(cases.refused_or_copied, timeout=90):
        assert "COMMLIB_DEVICE_PATH=kernel" in message and "does not fit" in message, message
        assert "COMMLIB_EMULATED_RESIDENT_BLOCKS=1" in message or "holds 1 resident" in message, message
        assert auto == (True, "copy", False)


@pytest.mark.timeout(120)
def test_two_communicators_kernels_on_one_device_do_not_deadlock(pool):
    assert pool(2, env=ENV).run(cases.two_communicators, timeout=90) == [True, True]
