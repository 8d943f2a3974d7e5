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
    """The acceptance's order (each rank's gradient receive posted before its activation send):
    it needs the receiving stream's wait not to hold up the send's stream, i.e. streams on
    different hardware queues (a queue per stream here, as when a process has at most
    CUDA_DEVICE_MAX_CONNECTIONS streams)."""
    env = dict(ENV, COMMLIB_EMULATED_CONNECTIONS="32")
    assert pool(size, env=env).run(lanes.two_lanes, "emulated", warm=warm, timeout=60) == [[]] * size


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size,warm", [(2, False), (4, False), (2, True), (4, True)])
def test_two_lanes_on_one_hardware_queue(pool, size, warm):
    """CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of a process on one hardware queue, so the
    process's operations may run one at a time in enqueue order (CUDA promises no independent
    progress of streams). The two lanes complete when each rank posts its gradient receive after
    its activation send (docs/gpu.md, "Streams sharing hardware queues": every order that
    completes with blocking calls in posting order completes; the engine adds no cycle of its own).
    The receive-first order cannot complete on one queue with any library (test_two_lane_pipeline
    runs it with a queue per stream)."""
    env = dict(ENV, COMMLIB_EMULATED_CONNECTIONS="1")
    assert pool(size, env=env).run(lanes.two_lanes, "emulated", warm=warm, order="send_first",
                                   timeout=40) == [[]] * size


@pytest.mark.timeout(200)
@pytest.mark.parametrize("connections", ["1", "8"])
def test_streams_sharing_hardware_queues(pool, connections):
    """COMMLIB_EMULATED_CONNECTIONS (CUDA_DEVICE_MAX_CONNECTIONS): with one hardware queue every
    stream of a process runs in enqueue order, so a wait holds up every stream behind it; the
    collective matrix (one communicator, sends and receives on two engine streams) and the
    point-to-point ring still complete, with 1 queue and with 8."""
    import device_cases
    import device_p2p_cases
    from test_device_collectives import covering_cases
    env = dict(ENV, COMMLIB_EMULATED_CONNECTIONS=connections)
    device_cases.check_results(pool(3, env=env).run(device_cases.check_cases, covering_cases(3), timeout=150))
    assert pool(3, env=env).run(device_p2p_cases.ring_shift, timeout=60) == [[]] * 3
