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
import graph_arena_cases  # noqa: E402
from graph_arena_cases import ARENA_EAGER_EVERY, ARENA_GROW_AT, ARENA_REPLAYS, captured_arena_step  # noqa: E402
from graph_cases import (EAGER_EVERY, REPLAYS, SIZES, async_error_during_replay, capture_after_plan_eviction,  # noqa: E402
                         capture_refusals, captured_mapped_auto, captured_step_matches_eager, kill_during_replay)
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
def test_a_captured_avg_all_reduce_divides_on_every_replay(pool):
    for rank, right in enumerate(pool(SIZE, env=DELAY_ENV).run(graph_cases.captured_avg_replays, timeout=60)):
        assert right == [True] * 4, (rank, right)


@pytest.mark.timeout(90)
def test_a_rank_killed_during_replays_is_a_peer_error_on_the_survivors():
    results = run_killing_one_rank(3, 0, kill_during_replay, env=dict(DELAY_ENV, **KERNEL_SETTINGS), timeout=60)
    assert_survivors_named_the_dead_rank(results, 0, call="replayed graph", within_s=20)


@pytest.mark.timeout(300)
def test_a_captured_step_staged_in_the_arena_outlives_its_growth_and_frees_it_when_destroyed(pool):
    """Captured one-sided calls on buffers no rank maps stage in the staging arena (the 4 KiB
    slots could not hold them: the capture would be refused), and the graph pins the arena it
    captured: replayed 40 times while eager calls grow the arena three times (each at least
    doubling it, alike on every rank), every replay equals the exact results and the eager step
    (in the newest arena) bit for bit. Only the graph's arena stays retired while the graph lives;
    destroyed, every retired arena is freed (counted), and no rank freed memory a peer still mapped."""
    results = pool(SIZE, env=DELAY_ENV).run(captured_arena_step, timeout=270)
    for rank, (wrong, differ_eager, compared, wrong_growth, captured, before, after, freed_mapped) in enumerate(results):
        assert wrong == [], f"rank {rank}: replays {wrong[:10]} differ from the exact results"
        assert differ_eager == [], f"rank {rank}: replays {differ_eager[:10]} differ from the eager step"
        assert compared == ARENA_REPLAYS // ARENA_EAGER_EVERY and wrong_growth == 0, (rank, compared, wrong_growth)
        assert {k: captured[k] for k in ("grown", "retired", "pinned", "freed")} == {
            "grown": 1, "retired": 0, "pinned": 0, "freed": 0}, (rank, captured)
        assert before["grown"] == 1 + len(ARENA_GROW_AT), (rank, before)
        # the graph's arena (the first) is retired and pinned, never freed while the graph lives
        assert before["pinned"] == 1 and before["retired"] >= 1, (rank, before)
        assert before["freed"] + before["retired"] == len(ARENA_GROW_AT), (rank, before)
        assert {k: after[k] for k in ("grown", "retired", "pinned", "freed")} == {
            "grown": before["grown"], "retired": 0, "pinned": 0, "freed": len(ARENA_GROW_AT)}, (rank, after)
        assert 1 <= after["tables"] <= 2, (rank, after)  # one per staged layout: input only, or in place
        assert freed_mapped == 0, (rank, freed_mapped)


@pytest.mark.timeout(150)
def test_a_retired_arena_is_freed_by_the_calls_after_its_graph_died_without_staging(pool):
    """A graph's arena retired by a growth, then the graph destroyed, and no call stages any more:
    the retired arena is freed at the next calls all the same (not kept until close): after two
    message-plan all_reduces with a barrier between, and after one mapped one-sided all_reduce
    (its route agreement: every rank published its done bit before it); counted: one more freed,
    none retired, the bytes held back to the current arena's; no export freed while mapped."""
    cycles, freed_mapped = zip(*pool(SIZE, env=DELAY_ENV).run(graph_arena_cases.retired_arenas_freed_without_staging,
                                                              timeout=130))
    for rank, per_rank in enumerate(cycles):
        for k, (before, after, current, right) in enumerate(per_rank):
            assert right, (rank, k)
            assert before["retired"] == 1 and before["pinned"] == 0 and before["freed"] == k, (rank, k, before)
            assert before["held_bytes"] >= current + (1 << 20), (rank, k, before, current)
            assert (after["retired"], after["freed"], after["held_bytes"]) == (0, k + 1, current), (rank, k, after)
        assert freed_mapped[rank] == 0, (rank, freed_mapped)


@pytest.mark.timeout(120)
def test_freeing_a_retired_arena_never_invalidates_a_global_capture(pool):
    """The eager calls that free a retired arena (closing imports, freeing memory: what a global-mode
    capture prohibits) run while this thread captures another stream in global mode: the calls run,
    the arena is freed, and the capture ends valid (the collection runs in relaxed mode)."""
    results = pool(SIZE, env=DELAY_ENV).run(graph_arena_cases.retired_arena_freed_during_a_global_capture,
                                            timeout=100)
    for rank, (ended, right, after) in enumerate(results):
        assert ended == "ok" and right, (rank, ended, right)
        assert (after["retired"], after["freed"]) == (0, 1), (rank, after)


@pytest.mark.timeout(150)
def test_the_plan_cache_evicts_alike_on_every_rank_whatever_graphs_each_holds(pool):
    """A graph alive on rank 0 only (rank 1 destroyed its copy) must not keep its plan in rank 0's
    cache past an eviction: a capture of that shape without a new warm-up is then refused by name
    on every rank, not on rank 1 alone (which left rank 0 with a graph its peer lacks)."""
    for rank, (outcome, new_right) in enumerate(pool(2, env=DELAY_ENV).run(capture_after_plan_eviction, timeout=130)):
        assert outcome.startswith("CommError") and "no warm-up call" in outcome, (rank, outcome)
        assert new_right, rank


@pytest.mark.timeout(90)
def test_a_rank_killed_during_replays_shows_in_async_error_without_a_call():
    """The graph's replays have no work handle: the survivors learn the death from
    Communicator.async_error() (ncclCommGetAsyncError's counterpart), polled with no call: None
    while healthy, then the PeerError naming the dead rank and the replayed collective, the same
    on a second query; the next call raises PeerError too."""
    results = run_killing_one_rank(3, 0, async_error_during_replay, env=dict(DELAY_ENV, **KERNEL_SETTINGS), timeout=60)
    assert results[0] is None
    for rank, (healthy, err, took, same_again, then) in enumerate(results[1:], 1):
        assert healthy, rank
        assert err is not None, f"rank {rank}: async_error() stayed None for {took:.1f} s"
        kind, message = err
        assert kind == "PeerError" and "rank 0" in message and "replayed graph" in message, (rank, err)
        assert took < 20 and same_again, (rank, took, same_again)
        assert then == "PeerError", (rank, then)


@pytest.mark.gpu
@pytest.mark.timeout(200)
def test_a_captured_step_staged_in_the_arena_on_cuda(pool):
    """test_a_captured_step_staged_in_the_arena_outlives_its_growth_... with torch.cuda.graph on
    GPU 0, buffers from torch's cudaMallocAsync pool (no peer maps them: staged). Not run on a GPU yet."""
    pytest.importorskip("torch")
    env = {"COMMLIB_TIMEOUT": "20", "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    for rank, (wrong, differ_eager, wrong_growth, before, after) in enumerate(
            pool(2, env=env).run(graph_arena_cases.captured_arena_step_cuda, timeout=180)):
        assert wrong == [] and differ_eager == [] and wrong_growth == 0, (rank, wrong, differ_eager, wrong_growth)
        assert before["pinned"] == 1 and before["grown"] == 1 + len(ARENA_GROW_AT), (rank, before)
        assert after["retired"] == 0 and after["freed"] == len(ARENA_GROW_AT), (rank, after)


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
