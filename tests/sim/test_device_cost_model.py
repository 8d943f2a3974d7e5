"""The kernel path's cost model (csrc/policy/device_cost.h) and device auto's ranking by it
(csrc/policy/device_auto.h): the traffic it counts is what the emulated device measures, the
choices per route and size are pinned, and docs/gpu.md's prediction table is the model's."""
import os
import re

import pytest

from commlib import _C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AR, RS = _C.Collective.all_reduce, _C.Collective.reduce_scatter
P, N = 4, 4 << 20  # ranks; input bytes per rank (tests/stream/test_one_sided_kernel.py's counted calls)

# (data read + written) / N and staged copies / N per rank at P = 4 on the slots' route, as
# tests/stream/test_one_sided_kernel.py::test_counters_per_algorithm measures them at the kernel's
# loads and stores (its EXPECTED table); mapped: no staged copies, and the two-shot's own-block copy
# moves 2 / P more (staged in place it moves nothing).
MEASURED = {
    (AR, "mapped_two_shot"): ((3 * P - 2) / P + (2 * P - 1) / P - 2 / P, 4),
    (AR, "mapped_fused_two_shot"): (2, 4),
    (AR, "mapped_one_shot"): ((3 * P - 2) + (2 * P - 1), 2),
    (RS, "mapped"): ((2 * P - 1) / P + 1, 2),
    (RS, "mapped_fused"): (1 + 1 / P, 2),
}


def cost(coll, algo, n_bytes, route, size=P):
    count = n_bytes // 4 // (size if coll == RS else 1)
    [k] = [k for k in _C.device_auto_candidates(coll, size, count, route=route, slots_bytes=1 << 40,
                                                policy_algorithm="ring") if k["algorithm"] == algo]
    return k


@pytest.mark.parametrize("route", ["mapped", "arena", "slots"])
def test_the_models_traffic_is_what_the_emulated_kernel_moves(route):
    for (coll, algo), (data, staged) in MEASURED.items():
        k = cost(coll, algo, N, route)
        if route == "mapped":
            staged = 0
            if algo == "mapped_two_shot":
                data += 2 / P  # out of place, its own block is copied from input to output
        assert k["staged_bytes"] / N == staged, (algo, route, k)
        assert k["traffic_bytes"] / N == pytest.approx(data + staged), (algo, route, k)


def test_the_fused_two_shots_waits_and_barriers_per_route():
    # ready, then result: two waits in sequence; the slots add the closing handshake. One grid
    # barrier mapped (the descriptor check's), two staged (the copy-in's and the copy-out's).
    got = {r: (cost(AR, "mapped_fused_two_shot", N, r)["waits"], cost(AR, "mapped_fused_two_shot", N, r)["grid_barriers"])
           for r in ("mapped", "arena", "slots")}
    assert got == {"mapped": (2, 1), "arena": (2, 2), "slots": (3, 2)}, got
    # two_shot through the slots: 8.75 N at P = 4 (issue #38's "about 8.5 N"), three waits (the
    # descriptor check's exchange on a grid, the reduce-scatter's and the all-gather's exchanges),
    # the same on every route
    for r in ("mapped", "arena", "slots"):
        k = cost(AR, "two_shot", N, r)
        assert (k["traffic_bytes"] / N, k["waits"], k["staged_bytes"]) == (8.75, 3, 0), k


def test_a_message_plan_on_one_block_folds_its_check():
    # KernelPath::launch: every item at most COMMLIB_DEVICE_LL_BYTES (8 KiB) runs on one block, where
    # a plan joining every peer folds the descriptor check into its data handshakes (the emulated
    # device counts folded_checks, no check_exchanges) and grid barriers are the block's own; a
    # larger call runs on a grid: the check is its own exchange and barrier (check_exchanges 1).
    # Session 31's H200 run: direct 45.3 us at 4 KiB (one block), 73.7 at 16 KiB (a grid).
    small, grid = cost(AR, "direct", 4 << 10, "mapped"), cost(AR, "direct", 16 << 10, "mapped")
    assert (small["waits"], small["grid_barriers"]) == (1, 0), small
    # direct's 5 steps and the check's barrier: the emulated device counts 6 per block at 16 KiB
    assert (grid["waits"], grid["grid_barriers"]) == (2, 6), grid
    # a one-sided plan on one block (a 1/P block of at most twice COMMLIB_DEVICE_BLOCK_BYTES per
    # handshake): no grid barrier; on more, the check's (mapped)
    assert cost(AR, "mapped_fused_two_shot", 1 << 20, "mapped")["grid_barriers"] == 0
    assert cost(AR, "mapped_fused_two_shot", 4 << 20, "mapped")["grid_barriers"] == 1


# Session 31's H200 run (4 ranks on one GPU under MPS, torch's caching allocator: mapped buffers),
# `commlib bench all_reduce --device cuda` median sync us per call (the table in docs/gpu.md
# "Device auto by the cost model"): what auto should take where the kernel path ran every candidate.
MEASURED_31 = {
    16 << 10: {"direct": 73.9, "two_shot": 60.4, "mapped_one_shot": 54.5, "mapped_two_shot": 56.5,
               "mapped_fused_two_shot": 46.7},
    64 << 10: {"direct": 412.0, "two_shot": 87.7, "mapped_one_shot": 55.6, "mapped_two_shot": 56.9,
               "mapped_fused_two_shot": 46.1},
    256 << 10: {"direct": 426.5, "two_shot": 552.1, "mapped_one_shot": 165.4, "mapped_two_shot": 61.1,
                "mapped_fused_two_shot": 49.5},
    1 << 20: {"direct": 391.3, "two_shot": 575.7, "mapped_one_shot": 293.6, "mapped_two_shot": 89.8,
              "mapped_fused_two_shot": 66.6},
}


def test_auto_takes_what_session_31_measured_fastest_on_mapped_buffers():
    got = {n: choice(AR, 4, n, "mapped") for n in MEASURED_31}
    want = {n: min(t, key=t.get) for n, t in MEASURED_31.items()}
    assert got == want, (got, want)


def test_the_model_reproduces_the_measurements_it_was_fitted_to():
    # the H200 runs of session 14 (docs/gpu.md "Measured on an H200"), 4 ranks, 64 and 256 MiB: the
    # model within 15% of each (mapped_two_shot's and two_shot's slopes are its rates)
    for algo, route, n, measured_us in (("mapped_two_shot", "mapped", 64 << 20, 369), ("mapped_two_shot", "mapped", 256 << 20, 1247),
                                        ("two_shot", "slots", 64 << 20, 1442), ("two_shot", "slots", 256 << 20, 6052),
                                        ("mapped_one_shot", "mapped", 64 << 20, 1298)):
        us = cost(AR, algo, n, route)["seconds"] * 1e6
        assert abs(us / measured_us - 1) < 0.15, (algo, n, us, measured_us)


def choice(coll, size, n_bytes, route, slots=64 << 20):
    count = n_bytes // 4 // (size if coll == RS else 1)
    return _C.device_auto_choice(coll, size, count, route=route, slots_bytes=slots, policy_algorithm="ring")


def test_auto_per_route_and_size():
    sizes = (8, 256 << 10, 1 << 20, 4 << 20, 64 << 20)
    fused = "mapped_fused_two_shot"
    assert [choice(AR, 4, n, "mapped") for n in sizes] == ["direct", fused, fused, fused, fused]
    assert [choice(AR, 4, n, "arena") for n in sizes] == ["direct", fused, fused, fused, fused]
    assert [choice(AR, 4, n, "slots") for n in sizes] == ["direct", "direct", fused, fused, fused]
    # through the slots only what fits them: 64 MiB staged in place needs 64 MiB
    assert choice(AR, 4, 64 << 20, "slots", slots=(64 << 20) - 1) == "two_shot"
    assert choice(AR, 4, 64 << 20, "slots", slots=64 << 20) == fused
    # reduce_scatter: the policy's (ring) while each rank reads at most 256 KiB of its peers
    assert [choice(RS, 4, n, r) for n in (256 << 10, 64 << 20) for r in ("mapped", "arena")] == \
        ["ring", "ring", "mapped_fused", "mapped_fused"]


def test_the_arena_staged_fused_two_shot_wins_where_the_model_says():
    # the reason for the change: at 64 MiB staged, two_shot (8.75 N through the slots at the message
    # plans' rate) against the fused two-shot (6 N with the copies) is about 3.4x slower
    two, fused = cost(AR, "two_shot", 64 << 20, "arena"), cost(AR, "mapped_fused_two_shot", 64 << 20, "arena")
    assert two["seconds"] / fused["seconds"] > 3, (two, fused)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="route"):
        _C.device_auto_choice(AR, 4, 16, route="nowhere")
    with pytest.raises(ValueError, match="size"):
        _C.device_auto_choice(AR, 1, 16)
    with pytest.raises(ValueError, match="collective"):
        _C.device_auto_candidates(_C.Collective.broadcast, 4, 16)


def test_only_the_shared_broadcast_is_host_only():
    host_only = [(c, a["name"]) for c in (AR, RS, _C.Collective.all_gather, _C.Collective.all_to_all,
                                          _C.Collective.broadcast, _C.Collective.reduce)
                 for a in _C.algorithm_info(c) if "host_only" in a["traits"]]
    assert host_only == [(_C.Collective.broadcast, "shared")], host_only


def model_table():
    """docs/gpu.md's table of the model's predictions: all_reduce float32 at 4 ranks, per size and route."""
    rows = []
    for n in (16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20):
        for route in ("mapped", "arena", "slots"):
            ks = _C.device_auto_candidates(AR, 4, n // 4, route=route, slots_bytes=64 << 20)
            us = {k["algorithm"]: (f"{k['seconds'] * 1e6:.0f}" if k["fits"] else "-") for k in ks}
            size = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
            rows.append(f"| {size} | {route} | " + " | ".join(us[a] for a in (
                "direct", "two_shot", "mapped_one_shot", "mapped_two_shot", "mapped_fused_two_shot")) +
                f" | {choice(AR, 4, n, route)} |")
    return rows


def test_docs_publish_the_models_predictions():
    with open(os.path.join(ROOT, "docs", "gpu.md")) as f:
        doc = f.read()
    missing = [r for r in model_table() if r not in doc]
    assert not missing, "docs/gpu.md's table differs from the model; regenerate:\n" + "\n".join(model_table())


def test_the_grid_settings_change_the_grids_the_model_costs():
    """COMMLIB_DEVICE_LL_BYTES (ll_bytes) and COMMLIB_DEVICE_BLOCK_BYTES (block_bytes) as the engine
    passes them: a small message plan is one block only while its items fit the LL protocol (never
    at 0: then a grid, its descriptor check its own exchange, a barrier per step and the check's);
    a one-sided grid takes a block per block_bytes of a handshake's region."""
    def direct(n, **grid):
        [k] = [k for k in _C.device_auto_candidates(AR, 3, n, route="mapped", **grid) if k["algorithm"] == "direct"]
        return k["waits"], k["grid_barriers"]
    assert direct(2) == (1, 0) and direct(2, ll_bytes=0) == (2, 5)
    assert direct(16384) == (2, 5) and direct(16384, ll_bytes=65536) == (1, 0)
    two = cost(AR, "mapped_fused_two_shot", 3 << 20, "mapped")  # 768 KiB a handshake at P = 4
    [small] = [k for k in _C.device_auto_candidates(AR, P, (3 << 20) // 4, route="mapped", block_bytes=4096)
               if k["algorithm"] == "mapped_fused_two_shot"]
    assert (two["grid_barriers"], small["grid_barriers"]) == (1, 1), (two, small)
    [one] = [k for k in _C.device_auto_candidates(AR, P, (3 << 20) // 4, route="mapped", block_bytes=1 << 20)
             if k["algorithm"] == "mapped_fused_two_shot"]
    assert one["grid_barriers"] == 0 and one["seconds"] < two["seconds"], one
    with pytest.raises(ValueError, match="block_bytes"):
        _C.device_auto_candidates(AR, P, 16, block_bytes=0)
