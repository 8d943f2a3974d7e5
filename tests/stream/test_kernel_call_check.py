"""The kernel path's per-call host work (issue #25): the call's descriptor check runs inside the
kernel (csrc/kernels/plan_call_check.cuh) instead of as two host functions per call, and the
calls' completion events are pooled (csrc/stream/event_pool.h) instead of created per call. On the
emulated device, in the rank pools of test_device_collectives.py (env DELAY_ENV); the mismatch,
killed-rank and silent-peer cases of the kernel path are in test_kernel_path.py (their waits are now
the kernel's own)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_call_check_cases import (events_per_call, host_functions_per_call, kernel_auto_choices,  # noqa: E402
                                     mismatch_found_by_the_kernel, reduce_scatter_auto)
from kernel_path_cases import check_kernel_and_copy  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402


def test_a_kernel_path_call_enqueues_no_host_function(pool):
    n = 8
    for per_path in pool(2, env=DELAY_ENV).run(host_functions_per_call, n, timeout=60):
        kernel_fns, copy_fns = check_kernel_and_copy(per_path)
        assert kernel_fns == 0, f"{kernel_fns} host functions for {n} kernel-path calls"
        # The counter counts: the copy path's check is two host functions per call.
        assert copy_fns >= 2 * n, copy_fns


def test_events_are_pooled_and_released_at_close(pool):
    n = 30
    for per_path, alive in pool(2, env=DELAY_ENV).run(events_per_call, n, timeout=60):
        for created in check_kernel_and_copy(per_path):
            assert created <= 4, f"{created} events created for {n} calls"
        assert alive == 0, f"{alive} emulated events still alive after both communicators closed"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("scenario", ["count", "collective"])
def test_the_kernel_finds_a_mismatch_the_control_plane_cannot_see(pool, scenario):
    names = ["all_reduce #", "9 x float32"] if scenario == "count" else ["all_reduce #", "broadcast #"]
    for rank, (msg, took, later) in enumerate(pool(2, env=DELAY_ENV).run(mismatch_found_by_the_kernel, scenario,
                                                                            timeout=80)):
        assert msg.startswith("MismatchError") and all(n in msg for n in names), f"rank {rank}: {msg}"
        assert "rank 0" in msg and "rank 1" in msg, msg
        assert took < 15, f"rank {rank} took {took:.1f} s (the communicator's timeout is 60 s)"
        assert later is not None and later < 1.0, f"rank {rank}: aborted communicator did not fail at once"


@pytest.mark.parametrize("path", ["auto", "kernel", "copy", "auto+override"])
def test_auto_takes_one_shot_or_two_shot_on_the_kernel_path(pool, path):
    # device_auto.h's rule at 3 ranks on one host, where the kernel path runs the call (auto: at
    # every size, no crossover by default): direct while (P - 1) x bytes <= 256 KiB, two_shot above;
    # the same before and after connect (else the first call's descriptor would differ from the
    # call's). On the copy path (forced) the policy's choice stands. An override
    # (COMMLIB_ALGO_ALL_REDUCE) keeps its word.
    settings = {"COMMLIB_DEVICE_PATH": path.split("+")[0]}
    if path.endswith("override"):
        settings["COMMLIB_ALGO_ALL_REDUCE"] = "ring"
    # (Buffers without a shareable handle: the mapped two-shot is not auto's; test_auto_maps_where_every_rank_can.)
    for before, after, policy, paths, ok, ran in pool(3, env=DELAY_ENV).run(kernel_auto_choices, settings, timeout=60):
        assert ok and before == after and ran == after, (before, after, ran)
        if path in ("auto", "kernel"):
            assert after == ["direct", "direct", "two_shot", "two_shot"], (after, policy)
            assert paths == ["kernel"] * 4, paths
        elif path == "copy":
            # where the rule would have changed every one of them
            assert all(p != r for p, r in zip(policy, ["direct", "direct", "two_shot"])), policy
            assert after == policy and paths == ["copy"] * 4, (after, policy, paths)
        else:
            assert after == ["ring"] * 4, after


MAPPED_AUTO = "mapped_fused_two_shot"  # auto's one-sided all_reduce on mapped buffers


@pytest.mark.parametrize("path,shareable", [("auto", (0, 1, 2)), ("auto", (0, 2)), ("kernel", (0, 1, 2))])
def test_auto_maps_where_every_rank_can(pool, path, shareable):
    """3 ranks, 8 B / 64 KiB / 256 KiB / just over 1 MiB: where every rank's buffers can be mapped,
    auto's all_reduce takes the one-sided two-shot wherever the kernel path takes the call (auto:
    every size, no crossover by default) and the two-shot would run (policy/device_auto.h); where
    one rank's buffer has no shareable handle (rank 1), every rank keeps the rule's choice (the
    ranks agree per call: a rank deciding alone would read a peer's buffer that peer staged)."""
    for before, after, policy, paths, ok, ran in pool(3, env=DELAY_ENV).run(
            kernel_auto_choices, {"COMMLIB_DEVICE_PATH": path}, None, shareable, timeout=60):
        assert ok and before == after == ["direct", "direct", "two_shot", "two_shot"], (before, after, policy)
        assert paths == ["kernel"] * 4, paths
        if len(shareable) == 3:
            assert ran == ["direct", "direct", MAPPED_AUTO, MAPPED_AUTO], ran
        else:
            assert ran == after, (ran, after)
    # reduce_scatter: the fused one-sided form above 256 KiB read from the peers, where every rank maps
    for ran, ok in pool(3, env=DELAY_ENV).run(reduce_scatter_auto, {"COMMLIB_DEVICE_PATH": path}, shareable, timeout=60):
        assert ok and ran[0] != "mapped_fused", ran
        assert (ran[1] == "mapped_fused") == (len(shareable) == 3), ran


# Rows measured on the kernel path for 3 ranks (and host rows that say otherwise): the kernel
# path's auto takes its rows over the built-in rule; host calls and the copy path take the host rows.
KERNEL_ROWS_TABLE = {"schema": "commlib-tuning/1",
                     "collectives": {"all_reduce": {"3": {"rows": [[-1, "tree"]]}}},
                     "kernel_path": {"all_reduce": {"3": {"rows": [[100, "ring"], [-1, "recursive_doubling"]]}}}}


@pytest.mark.parametrize("path", ["auto", "kernel", "copy"])
def test_kernel_path_tuning_rows_win_over_the_rule(pool, path):
    settings = {"COMMLIB_DEVICE_PATH": path}
    for before, after, policy, paths, ok, ran in pool(3, env=DELAY_ENV).run(kernel_auto_choices, settings,
                                                                             KERNEL_ROWS_TABLE, timeout=60):
        assert ok and before == after and ran == after, (before, after, ran)
        assert policy == ["tree"] * 4, policy  # the host's resolution never reads kernel-path rows
        kernel_rows = ["ring", "recursive_doubling", "recursive_doubling", "recursive_doubling"]
        want = {"auto": kernel_rows, "kernel": kernel_rows, "copy": ["tree"] * 4}[path]
        assert after == want, after
        assert paths == {"auto": ["kernel"] * 4, "kernel": ["kernel"] * 4, "copy": ["copy"] * 4}[path]
