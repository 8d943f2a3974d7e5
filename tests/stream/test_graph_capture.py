"""Kernel-path collectives captured in graphs on the emulated device (issue #37, item 3): every
per-call counter lives on the device and is advanced by the kernel, so a captured step replays
right any number of times between eager calls; a capture the engine cannot honour (no warm-up, the
copy path) raises an error saying why. The ranks share the collective matrix's pool (DELAY_ENV:
the stream delay perturbs every item of every block)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graph_cases  # noqa: E402
from graph_cases import (EAGER_EVERY, REPLAYS, SIZES, capture_refusals, captured_mapped_auto,  # noqa: E402
                         captured_step_matches_eager, kill_during_replay)
from kernel_path_cases import KERNEL_SETTINGS  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

SIZE = 3


@pytest.mark.timeout(300)
def test_a_captured_step_replayed_between_eager_calls_equals_the_eager_results(pool):
    results = pool(SIZE, env=DELAY_ENV).run(captured_step_matches_eager, timeout=240)
    for rank, (differ, wrong_other, compared, replayed) in enumerate(results):
        assert differ == [], f"rank {rank}: replays {differ[:10]} differ from the eager step"
        assert wrong_other == 0, f"rank {rank}: {wrong_other} eager calls between replays were wrong"
        assert compared == REPLAYS // EAGER_EVERY, (rank, compared)
        assert replayed == REPLAYS * (len(SIZES) + 1), (rank, replayed)  # the kernel counted every replayed launch


@pytest.mark.timeout(120)
def test_an_auto_all_reduce_warmed_up_mapped_captures_and_replays(pool):
    """Captured calls never agree on a one-sided route: an auto all_reduce whose warm-up ran as the
    mapped (fused) two-shot is captured with that plan (staged through the slots), not refused for
    want of the two-shot's; eager calls staged in the staging arena between its replays agree bit for bit."""
    for rank, (algorithm, differ, arena) in enumerate(pool(SIZE, env=DELAY_ENV).run(captured_mapped_auto, timeout=90)):
        assert algorithm == "mapped_fused_two_shot", (rank, algorithm)
        assert differ == [], (rank, differ)
        assert arena >= (1 << 18), (rank, arena)  # the eager calls staged in the arena


@pytest.mark.timeout(120)
def test_capture_without_warm_up_or_on_the_copy_path_is_refused_by_name(pool):
    for rank, ((before_engine, other_shape, ok), (copy_refused, copy_ok)) in enumerate(
            pool(SIZE, env=DELAY_ENV).run(capture_refusals, timeout=90)):
        assert before_engine.startswith("CommError") and "warm-up" in before_engine, (rank, before_engine)
        assert other_shape.startswith("CommError") and "warm-up" in other_shape, (rank, other_shape)
        assert "plan" in other_shape, (rank, other_shape)
        assert copy_refused.startswith("CommError") and "copy path, which refuses capture" in copy_refused, (
            rank, copy_refused)
        assert ok and copy_ok, rank  # the communicator works on after a refused capture


@pytest.mark.timeout(90)
def test_a_rank_killed_during_replays_is_a_peer_error_on_the_survivors():
    results = run_killing_one_rank(3, 0, kill_during_replay, env=dict(DELAY_ENV, **KERNEL_SETTINGS), timeout=60)
    assert_survivors_named_the_dead_rank(results, 0, call="replayed graph", within_s=20)


@pytest.mark.gpu
@pytest.mark.timeout(150)
def test_a_torch_captured_step_replays_like_the_eager_one_on_cuda(pool):
    """The same with torch.cuda.graph on GPU 0: 100 replays, each between eager calls, made cheap
    as on the emulated device (inputs uploaded once, everything stream-ordered, one synchronize).
    20 replays passed on an H200 in session 14, before the one-block small call; 100 have not run
    on a GPU yet (docs/gpu.md)."""
    pytest.importorskip("torch")
    for rank, (differ, wrong_other, before_warm_up) in enumerate(pool(2, env={"COMMLIB_TIMEOUT": "20"}).run(
            graph_cases.captured_step_cuda, timeout=120)):
        assert differ == [], f"rank {rank}: replays {differ[:10]} differ from the eager step"
        assert wrong_other == 0, (rank, wrong_other)
        assert "warm-up" in before_warm_up, (rank, before_warm_up)
