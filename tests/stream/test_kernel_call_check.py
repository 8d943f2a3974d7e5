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
from kernel_call_check_cases import (AUTO_COUNTS, arena_lost, auto_against_fixed, broadcast_auto,  # noqa: E402
                                     events_per_call,
                                     host_functions_per_call, kernel_auto_choices, mismatch_found_by_the_kernel,
                                     prepared_premul_sum_across_arena_changes, reduce_scatter_auto)
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


def model_choices(coll, size, counts, route, policy="", **grid):
    """What device auto takes per policy/device_auto.h rules 2 and 3 (the cost model of
    policy/device_cost.h), asked of the model in this process: the tests compare a run's choice
    with it, and pin it too, so that neither the rule nor the engine's route can drift alone.
    `grid`: ll_bytes, block_bytes (the grid settings the model is told, defaults theirs)."""
    from commlib import _C
    return [_C.device_auto_choice(getattr(_C.Collective, coll), size, n, route=route, slots_bytes=64 << 20,
                                  policy_algorithm=policy, **grid) for n in counts]


@pytest.mark.parametrize("path", ["auto", "kernel", "copy", "auto+override"])
def test_auto_takes_the_models_choice_on_the_kernel_path(pool, path):
    # device_auto.h's rule at 3 ranks on one host, where the kernel path runs the call (auto: at
    # every size, no crossover by default), buffers no peer can map, so staged in the arena
    # (COMMLIB_DEVICE_STAGING=pool, the default): direct while (P - 1) x bytes <= 256 KiB, above it
    # the cost model's fastest on the arena's route (the fused two-shot staged, not two_shot, from
    # 256 KiB since session 31's correction of direct's waits on a grid: docs/gpu.md); the
    # same before and after connect (else the first call's descriptor would differ from the call's).
    # On the copy path (forced) the policy's choice stands. An override (COMMLIB_ALGO_ALL_REDUCE)
    # keeps its word.
    settings = {"COMMLIB_DEVICE_PATH": path.split("+")[0]}
    if path.endswith("override"):
        settings["COMMLIB_ALGO_ALL_REDUCE"] = "ring"
    arena = ["direct", "direct", MAPPED_AUTO, MAPPED_AUTO]
    assert model_choices("all_reduce", 3, AUTO_COUNTS, "arena") == arena
    for before, after, policy, paths, ok, ran in pool(3, env=DELAY_ENV).run(kernel_auto_choices, settings, timeout=60):
        assert ok and before == after and ran == after, (before, after, ran)
        if path in ("auto", "kernel"):
            assert after == arena, (after, policy)
            assert paths == ["kernel"] * 4, paths
        elif path == "copy":
            # where the rule would have changed every one of them
            assert all(p != r for p, r in zip(policy, arena)), policy
            assert after == policy and paths == ["copy"] * 4, (after, policy, paths)
        else:
            assert after == ["ring"] * 4, after


MAPPED_AUTO = "mapped_fused_two_shot"  # auto's one-sided all_reduce (docs/gpu.md "Device auto by the cost model")


@pytest.mark.parametrize("path,shareable,staging", [("auto", (0, 1, 2), "pool"), ("auto", (0, 2), "pool"),
                                                    ("kernel", (0, 1, 2), "pool"), ("auto", (0, 2), "slots")])
def test_auto_maps_where_every_rank_can(pool, path, shareable, staging):
    """3 ranks, 8 B / 64 KiB / 256 KiB / just over 1 MiB: auto's all_reduce takes the cost model's
    choice on the route the call takes (policy/device_auto.h): where every rank's buffers can be
    mapped, the fused two-shot from 64 KiB (the model at every size there: session 31's H200 run);
    where one rank's buffer has no shareable handle (rank 1), every rank stages (the ranks agree per
    call: a rank deciding alone would read a peer's buffer that peer staged), in the arena or
    (COMMLIB_DEVICE_STAGING=slots) through the slots, where rule 2 keeps direct while a rank
    receives at most 256 KiB: the fused two-shot staged from 256 KiB. Results are checked on every rank."""
    settings = {"COMMLIB_DEVICE_PATH": path, "COMMLIB_DEVICE_STAGING": staging}
    route = "mapped" if len(shareable) == 3 else "arena" if staging == "pool" else "slots"
    # mapped: the model at every size (session 31 measured the fused two-shot fastest from 16 KiB);
    # staged: rule 2 (direct) while a rank receives at most 256 KiB, the model above
    want = {"mapped": ["direct", MAPPED_AUTO, MAPPED_AUTO, MAPPED_AUTO],
            "arena": ["direct", "direct", MAPPED_AUTO, MAPPED_AUTO],
            "slots": ["direct", "direct", MAPPED_AUTO, MAPPED_AUTO]}[route]
    assert model_choices("all_reduce", 3, AUTO_COUNTS, route) == want
    for before, after, policy, paths, ok, ran in pool(3, env=DELAY_ENV).run(
            kernel_auto_choices, settings, None, shareable, timeout=60):
        # before and after: what a call not mapped resolves to (the setting's staged route)
        assert ok and before == after == model_choices("all_reduce", 3, AUTO_COUNTS,
                                                       "arena" if staging == "pool" else "slots"), (before, after)
        assert paths == ["kernel"] * 4, paths
        assert ran == want, (ran, route)
    # reduce_scatter: the fused one-sided form above 256 KiB read from the peers, mapped or in the
    # arena (3.25 N of traffic against ring's 3.75 N at the message plans' rate), and through the
    # slots since session 31 (ring's descriptor check is its own exchange on a grid: one more wait)
    rs_route = route
    rs_want = {"mapped": ["ring", "mapped_fused"], "arena": ["ring", "mapped_fused"],
               "slots": ["ring", "mapped_fused"]}[rs_route]
    assert model_choices("reduce_scatter", 3, (16384, 65537), rs_route, "ring") == rs_want
    for ran, ok in pool(3, env=DELAY_ENV).run(reduce_scatter_auto, settings, shareable, timeout=60):
        assert ok and ran == rs_want, (ran, rs_want)


@pytest.mark.parametrize("ll_bytes,want", [(0, [MAPPED_AUTO] * 4), (65536, ["direct", "direct", MAPPED_AUTO, MAPPED_AUTO])])
def test_auto_costs_the_grids_the_settings_launch(pool, ll_bytes, want):
    """COMMLIB_DEVICE_LL_BYTES decides whether a small message plan runs on one block (the LL
    protocol) or a grid with its own descriptor exchange: device auto ranks the grid the kernel path
    will launch, not the setting's default. Mapped buffers, 3 ranks: at 0 (never LL) direct's 8 B
    is a grid and the fused two-shot wins there too; at 64 KiB direct's 64 KiB call stays on one
    block and wins (the default, 8 KiB: [direct, fused two-shot x 3])."""
    assert model_choices("all_reduce", 3, AUTO_COUNTS, "mapped") == ["direct"] + [MAPPED_AUTO] * 3
    assert model_choices("all_reduce", 3, AUTO_COUNTS, "mapped", ll_bytes=ll_bytes) == want
    settings = {"COMMLIB_DEVICE_PATH": "auto", "COMMLIB_DEVICE_LL_BYTES": str(ll_bytes)}
    for before, after, policy, paths, ok, ran in pool(3, env=DELAY_ENV).run(
            kernel_auto_choices, settings, None, (0, 1, 2), timeout=60):
        assert ok and paths == ["kernel"] * 4, (ok, paths)
        assert ran == want, (ran, want)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("staging", ["pool", "slots"])
def test_auto_on_staged_buffers_is_the_models_and_the_fixed_algorithms_bits(pool, staging):
    """4 ranks, buffers no rank can map (every call staged), float32 random data: 64 KiB (direct),
    1 MiB and 4 MiB (the model: the fused two-shot staged in the arena, 6 N of traffic against
    two_shot's 8.75 N at the message plans' rate; through the slots too, where two_shot's check
    exchange on a grid outweighs the closing handshake since session 31). Each auto call ran the model's
    choice, staged where one-sided (the arena: no closing handshake; the slots: one more per block),
    its bits equal to the same call naming that algorithm and the same on every rank. Fails if auto
    takes two_shot on arena-staged buffers where the model says the fused two-shot is faster."""
    P, counts = 4, (16384, 1 << 18, 1 << 20)
    route = "arena" if staging == "pool" else "slots"
    want = {"arena": ["direct", MAPPED_AUTO, MAPPED_AUTO], "slots": ["direct", MAPPED_AUTO, MAPPED_AUTO]}[route]
    assert model_choices("all_reduce", P, counts, route) == want
    settings = {"COMMLIB_DEVICE_PATH": "auto", "COMMLIB_DEVICE_STAGING": staging}
    per_rank = pool(P, env=DELAY_ENV).run(auto_against_fixed, settings, (), counts, timeout=100)
    for rank_out in per_rank:
        assert [ran for ran, *_ in rank_out] == want, rank_out
        for (ran, same, _, staged, handshakes), n in zip(rank_out, counts):
            assert same, (ran, n)  # auto's bits are the named algorithm's
            if ran == MAPPED_AUTO:  # staged: the copies in and out (4 N), ready + result (+ the slots' closing)
                assert staged == 4 * n * 4, (ran, staged)
                assert handshakes == (2 if route == "arena" else 3) * (P - 1), handshakes
    for k in range(len(counts)):  # every rank ended with the same bits
        assert len({rank_out[k][2] for rank_out in per_rank}) == 1, k


@pytest.mark.timeout(120)
def test_auto_follows_the_route_when_an_arena_cannot_grow(pool):
    """4 ranks, 1 MiB auto all_reduce on buffers no rank maps: the model's arena choice is the fused
    two-shot, its slots choice two_shot (policy/device_auto.h). Rank 1's device fails its next
    allocation, so the first staged call cannot make rank 1's arena: pool staging turns off on every
    rank at that call, which then takes the slots' choice, and so do the calls after it (the
    prepared call's slots plan); exact integer sums, the same bits on every rank, no arena left."""
    count = 1 << 16  # 256 KiB (1 MiB before session 31, where both routes now take the fused two-shot)
    assert model_choices("all_reduce", 4, (count,), "arena") == [MAPPED_AUTO]
    assert model_choices("all_reduce", 4, (count,), "slots") == ["direct"]
    per_rank = pool(4, env=DELAY_ENV).run(arena_lost, count, timeout=100)
    for calls, arena in per_rank:
        assert [ran for ran, _, _ in calls] == ["direct"] * 3, calls
        assert all(ok for _, ok, _ in calls) and arena == 0, (calls, arena)
    for k in range(3):
        assert len({calls[k][2] for calls, _ in per_rank}) == 1, k


@pytest.mark.timeout(120)
def test_a_prepared_premul_sum_follows_the_arena_grown_and_lost(pool):
    """A prepared auto premul_sum all_reduce (it stages its scaled input without agreeing a route,
    256 KiB at 4 ranks: the model's arena choice the fused two-shot, its slots choice direct) keeps
    the arena's plan while the arena grows, and takes the slots' choice once the arena is lost (a
    growth rank 1 cannot allocate: pool staging off on every rank), as a call not prepared does;
    exact sums, the same bits on every rank."""
    count = 1 << 16  # 256 KiB (1 MiB before session 31, where both routes now take the fused two-shot)
    assert model_choices("all_reduce", 4, (count,), "arena") == [MAPPED_AUTO]
    assert model_choices("all_reduce", 4, (count,), "slots") == ["direct"]
    per_rank = pool(4, env=DELAY_ENV).run(prepared_premul_sum_across_arena_changes, count, timeout=100)
    for rank, (calls, calls_right, grown_bytes, end_bytes) in enumerate(per_rank):
        assert [ran for ran, _, _ in calls] == [MAPPED_AUTO] * 3 + ["direct"] * 2, (rank, calls)
        assert all(ok for _, ok, _ in calls) and calls_right, (rank, calls)
        assert grown_bytes > count * 4 and end_bytes == 0, (rank, grown_bytes, end_bytes)
    for k in range(len(per_rank[0][0])):
        assert len({calls[k][2] for calls, *_ in per_rank}) == 1, k


def test_a_device_broadcast_never_takes_the_host_only_shared_rows(pool):
    """The shipped tuning table's host rows send a 4-rank broadcast above 64 KiB to "shared" (the
    host engine's one write into shared memory: kHostOnly in the registry); a device broadcast of
    1 MiB resolves to the device's own choice instead (the built-in heuristic: scatter_allgather),
    on the kernel path and the copy path, and runs it. At 4 KiB host and device agree unless the
    machine's host rows say "shared" there too (the Intel Xeon section does, from 8 B), when the
    device again takes its own choice."""
    counts = (1024, 1 << 18)  # 4 KiB, 1 MiB of float32
    for path in ("auto", "copy"):
        for rank_out in pool(4, env=DELAY_ENV).run(broadcast_auto, {"COMMLIB_DEVICE_PATH": path}, counts, timeout=60):
            (host_s, dev_s, ran_s, _, ok_s), (host_l, dev_l, ran_l, path_l, ok_l) = rank_out
            assert ok_s and ok_l, rank_out
            assert host_l == "shared", rank_out  # the shipped table's host row (else this test proves nothing)
            assert dev_l == ran_l == "scatter_allgather", rank_out
            assert path_l == ("kernel" if path == "auto" else "copy"), rank_out
            assert dev_s == ran_s != "shared", rank_out
            assert host_s == "shared" or dev_s == host_s, rank_out


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
