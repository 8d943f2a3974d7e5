"""A laned schedule on the kernel path, counted on the emulated device (issue #39, csrc/kernels/
device_list.h): rail_ring's channels (on one host the ring and its reverse, 2 lanes) run as one
step a ring round, C concurrent exchanges between two grid barriers, as a one-channel ring's rounds
do: the grid barriers of a launch are the ring's (4 blocks x (the descriptor exchange + 2 (P - 1)
steps)), not C times its steps'; and the results are right. Run in the counting pool of
test_call_counts.py (its communicators make no device call themselves)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from call_count_cases import launch_counts  # noqa: E402
from test_call_counts import COUNTING  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402


@pytest.mark.timeout(120)
def test_rail_ring_runs_one_step_a_round_on_the_kernel_path(pool):
    P, grid = 4, 4
    count = 8192  # 32 KiB of float32: chunks of the slot protocol, so the launch keeps its grid
    ring, rails = ("ring", count), ("rail_ring", count)
    for out in pool(P, env=DELAY_ENV, own=COUNTING).run(launch_counts, [ring, rails], timeout=100):
        assert all(right for _, right in out.values()), out
        per = {case: counts for case, (counts, _) in out.items()}
        assert per[ring]["message_blocks"] == per[rails]["message_blocks"] == grid, per
        assert per[ring]["grid_barriers"] == grid * (1 + 2 * (P - 1)), per[ring]
        assert per[rails]["grid_barriers"] == per[ring]["grid_barriers"], per[rails]  # list order: grid * (1 + 4 (P - 1))
