"""A pipeline's two lanes on the emulated device (issue #23's acceptance): activations forward on
one communicator and stream, gradients backward on another, each rank posting its gradient
receive before its activation send; 2 and 4 ranks, as the lanes' first device calls and after a
collective on each (rank-side code in device_lanes_cases.py; on a GPU: test_cuda_ranks.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_lanes_cases as lanes  # noqa: E402

# A hang shows as a timeout of the pool's call well inside the test's.
ENV = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_TIMEOUT": "20"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size,warm", [(2, False), (4, False), (2, True), (4, True)])
def test_two_lane_pipeline(pool, size, warm):
    assert pool(size, env=ENV).run(lanes.two_lanes, "emulated", warm=warm, timeout=60) == [[]] * size
