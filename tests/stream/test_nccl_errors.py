"""NCCL failures in the stream engine, on the emulated NCCL (a test double of NCCL's API semantics,
csrc/device/emulated/nccl_emulated.h): an asynchronous NCCL error (ncclCommGetAsyncError, polled by the
watchdog) fails the call on every rank naming NCCL and the call, and ncclCommAbort releases the
streams; a stream blocked inside NCCL times out saying so (rank-side code in nccl_cases.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccl_cases  # noqa: E402

# One emulated device per rank: the emulated NCCL, like NCCL, refuses two ranks on one device.
PER_RANK = tuple(map(str, range(8)))
DELAY = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_EMULATED_DEVICE": PER_RANK}


@pytest.mark.timeout(120)
def test_async_nccl_error_fails_every_rank_and_releases_the_streams(pool):
    results = pool(3, env=DELAY).run(nccl_cases.async_error, 1, timeout=60)
    for rank, res in enumerate(results):
        assert res is not None, f"rank {rank} finished without error"
        kind, msg, took, released = res
        assert kind == "CommError", (rank, kind, msg)
        assert "asynchronous error" in msg and "unhandled system error" in msg and "all_reduce" in msg, (rank, msg)
        assert "rank 1" in msg and took < 10 and released, (rank, msg, took, released)


@pytest.mark.timeout(120)
def test_timeout_inside_nccl_names_the_nccl_call():
    from commlib.testing import RankPool
    pool = RankPool(2, timeout=60, env={"COMMLIB_EMULATED_DELAY_US": ("20", "3000000"), "COMMLIB_EMULATED_DEVICE": PER_RANK})
    try:
        kind, msg, took = pool.run(nccl_cases.silent_inside_nccl, timeout=60)[0]
    finally:
        pool.kill()
    assert kind == "PeerError" and "COMMLIB_TIMEOUT" in msg, msg
    assert "inside NCCL (ncclAllReduce with rank 1)" in msg and "join" not in msg, msg
    assert 2.0 < took < 12, took


def test_two_ranks_on_one_gpu_are_refused_before_nccl():
    """Issue #23 item 8: NCCL refuses a communicator with two ranks on one GPU; commlib names them
    before ncclCommInitRank, for emulated devices as for CUDA ones."""
    from commlib.device.nccl_comm import duplicate_gpus
    assert duplicate_gpus(["0/cuda:0", "0/cuda:1", "1/cuda:0", "0/cuda:1"]) == (1, 3)
    assert duplicate_gpus(["0/cuda:0", "1/cuda:0"]) is None
    assert duplicate_gpus(["0/emulated:0", "0/emulated:0"]) == (0, 1)
    assert duplicate_gpus(["0/emulated:0", "0/emulated:1", "1/emulated:0"]) is None


@pytest.mark.timeout(60)
def test_emulated_nccl_refuses_two_ranks_on_one_device(pool):
    """Issue #23 item 8 on the emulated device: algorithm="nccl" with both ranks on emulated:0
    raises CommError naming both ranks before ncclCommInitRank, and the emulated NCCL's own
    ncclCommInitRank refuses them as NCCL does."""
    for ours, theirs in pool(2, env=DELAY).run(nccl_cases.two_ranks_on_one_device, timeout=40):
        assert ours and "ranks 0 and 1" in ours and "emulated:0" in ours, ours
        assert theirs and "Duplicate GPU detected: rank 0 and rank 1 both on emulated:0" in theirs, theirs
