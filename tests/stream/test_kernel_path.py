"""The kernel path (COMMLIB_DEVICE_PATH=kernel: one kernel launch per collective interpreting the
rank's device plan, csrc/stream/kernel_path.h) on the emulated device, whose blocks run on host
threads concurrently, with the stream delay on (it also perturbs every item of every block) and
every rank of a pool sharing emulated device 0.

CI time: the tests run in the SAME rank pools as the copy path's matrix (test_device_collectives.py:
one pool per world size, env DELAY_ENV), switching to the kernel path per sub-communicator (the path
and slot settings are read when a sub-communicator's engine is created; kernel_path_cases.py), so no
pool is started for this file when the suite runs.

The covering selection (pairwise over collective x algorithm, world size and count): at world sizes
1-5 and 8 every collective x algorithm (auto included) runs ONE of the counts 0, 1, P-1, 13, 97,
rotating with the world size, so every algorithm meets every count across the sizes and every
size every count; dtypes, ops, roots and placement rotate across the cases. Every dtype x op (each
a kernel instantiation) runs at size 3; one ~1M-element call per collective at size 3. Small slots
(4 KiB, 2 slots; 32 KiB for the ~1M calls) make messages many chunks through few slots, so slot
reuse and the flags' order are exercised; COMMLIB_DEVICE_LL_BYTES=1024 makes small chunks take the
LL protocol and larger ones the slot-and-flag protocol in the same calls. Then errors on the kernel
path: mismatched calls, a killed rank, a silent peer (the abort word releases the kernel), and the
auto/kernel/copy choice itself."""
import os
import sys

import pytest

import commlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
from kernel_path_cases import KERNEL_SETTINGS, kernel_matrix, mixed_settings, paths_per_setting, with_settings  # noqa: E402
from device_cases import cc  # noqa: E402
import error_cases  # noqa: E402  (tests/host: on sys.path through device_cases)
from test_device_collectives import COLLECTIVES, DELAY_ENV, ROOTED, _ops, big_cases, dtype_op_sweep  # noqa: E402

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

KERNEL = dict(DELAY_ENV, **KERNEL_SETTINGS)  # for tests that start their own processes


def kernel_covering_cases(P):
    """Every collective x algorithm at world size P with one count, rotating with P."""
    out, k = [], P
    counts = (0, 1, max(P - 1, 0), 13, 97)
    for coll in COLLECTIVES:
        for a, algo in enumerate(["auto"] + commlib.algorithms(coll)):
            dtype = cc.DTYPES[k % len(cc.DTYPES)]
            op = _ops(dtype)[k % len(_ops(dtype))] if coll in device_cases.REDUCING else "sum"
            root = (0, P - 1, P // 2)[k % 3] if coll in ROOTED else 0
            out.append((coll, algo, dtype, op, counts[(a + P) % 5], root, k % 2 == 1))
            k += 1
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_collective_matrix_on_the_kernel_path(pool, size):
    small = kernel_covering_cases(size) + (dtype_op_sweep(size) if size == 3 else [])
    big = big_cases(size) if size == 3 else []
    results = pool(size, env=DELAY_ENV).run(kernel_matrix, small, big, timeout=240)
    device_cases.check_results([(f, d) for f, d, _, _ in results])
    for _, _, paths, ran in results:
        assert paths == ["kernel"] and ran == len(small) + len(big), (paths, ran)


def test_auto_chooses_by_size_and_the_setting_forces(pool):
    # auto: the kernel path at every size (no crossover by default; test_device_path_tuning.py moves it)
    want = {"auto": ["kernel", "kernel"], "copy": ["copy", "copy"], "kernel": ["kernel", "kernel"]}
    for res in pool(2, env=DELAY_ENV).run(paths_per_setting, list(want)):
        assert res == [[(w, True) for w in ws] for ws in want.values()], res


@pytest.mark.timeout(90)
@pytest.mark.parametrize("scenario", ["collective", "count"])
def test_mismatch_raises_on_every_rank_on_the_kernel_path(pool, scenario):
    results = pool(3, env=DELAY_ENV).run(with_settings, KERNEL_SETTINGS, error_cases.mismatch, scenario, "device",
                                           timeout=60)
    for rank, (msg, took, later, names) in enumerate(results):
        assert msg is not None, f"rank {rank} got no error"
        assert all(n in msg for n in names), f"rank {rank}: message does not name both calls: {msg}"
        assert took < 20, f"rank {rank} took {took:.1f} s"
        assert later is not None and later < 1.0, f"rank {rank}: aborted communicator did not fail at once"


@pytest.mark.timeout(90)
def test_killed_peer_raises_peer_error_on_the_kernel_path():
    results = run_killing_one_rank(3, 0, error_cases.kill_during_collective, env=KERNEL, timeout=60,
                                   args=("device",))
    assert_survivors_named_the_dead_rank(results, 0, within_s=20)


@pytest.mark.timeout(60)
def test_silent_peer_times_out_and_the_abort_word_releases_the_kernel(pool):
    res = pool(2, env=DELAY_ENV).run(with_settings, KERNEL_SETTINGS, error_cases.silent_peer, "device", timeout=40)
    msg, took = res[0]
    assert "rank 1" in msg and "all_reduce" in msg and "COMMLIB_TIMEOUT" in msg, msg
    assert 1.0 < took < 10, took
    assert res[1][0].startswith(("PeerError", "CommError")), res[1]


@pytest.mark.parametrize("name,rank1,rank0", [("COMMLIB_DEVICE_PATH", "copy", "kernel"),
                                              ("COMMLIB_DEVICE_LL_BYTES", "0", "1024"),
                                              ("COMMLIB_DEVICE_STAGING", "slots", "pool")])
def test_ranks_with_different_settings_are_refused(pool, name, rank1, rank0):
    # The first call (a small auto all_reduce) resolves to direct on the kernel path and to the
    # policy's choice on the copy path (policy/device_auto.h): the set-up still names the setting.
    base = {"COMMLIB_DEVICE_PATH": "kernel"}
    for late_rank in (None, 0, 1):  # together, then each rank's first call found published by the other
        for msg in pool(2, env=DELAY_ENV).run(mixed_settings, dict(base, **{name: rank1}), dict(base, **{name: rank0}),
                                              late_rank, timeout=40):
            assert msg.startswith("ValueError") and name in msg and "every rank must use the same" in msg, (late_rank, msg)


def test_a_bad_device_path_is_refused_naming_the_choices(pool):
    # The engine's reader (param_choice): the same message as every enumerated setting's.
    msg, = pool(1).run(mixed_settings, {}, {"COMMLIB_DEVICE_PATH": "bogus"}, timeout=40)
    assert msg == "ValueError: COMMLIB_DEVICE_PATH: expected one of auto, kernel, copy, got 'bogus'", msg


def test_ranks_whose_auto_differs_by_override_get_a_mismatch_from_the_call(pool):
    # The first call's check lets an algorithm-only difference pass to connect (policy/device_auto.h);
    # where every device setting agrees, the call's own check (in the kernel) names both calls.
    base = {"COMMLIB_DEVICE_PATH": "kernel"}
    for msg in pool(2, env=DELAY_ENV).run(mixed_settings, dict(base, COMMLIB_ALGO_ALL_REDUCE="ring"), base,
                                          timeout=40):
        assert msg.startswith("MismatchError") and "ring" in msg and "direct" in msg, msg


# -- on a GPU ------------------------------------------------------------------------------------

def _torch_kernel_path(comm, path):
    """Several ranks on GPU 0, COMMLIB_DEVICE_PATH=`path`: all_reduce (ring and direct), all_gather,
    reduce_scatter and broadcast, small and 1M elements; returns (all right, paths taken)."""
    import torch
    torch.cuda.set_device(0)
    P, r = comm.size, comm.rank
    ok, paths = True, set()
    for n in (8, 1 << 20):
        for algo in ("ring", "direct"):
            x = torch.full((n,), float(r + 1), device="cuda")
            comm.all_reduce(x, algorithm=algo)
            paths.add(comm._device_route.last_path())
            ok &= bool((x == P * (P + 1) / 2).all().item())
        y = torch.empty(n * P, device="cuda")
        comm.all_gather(y, torch.full((n,), float(r), device="cuda"))
        ok &= bool((y.view(P, n) == torch.arange(P, device="cuda", dtype=torch.float32)[:, None]).all().item())
        z = torch.empty(n, device="cuda")
        comm.reduce_scatter(z, torch.ones(n * P, device="cuda"))
        ok &= bool((z == P).all().item())
        b = torch.full((n,), float(r), device="cuda")
        comm.broadcast(b, root=P - 1)
        ok &= bool((b == P - 1).all().item())
    torch.cuda.synchronize()
    return ok, sorted(paths)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["kernel", "copy"])
def test_kernel_path_on_a_gpu_several_ranks(pool, path):
    # Without MPS the ranks' kernels time-slice on the GPU (correct, slow: docs/gpu.md); a hang is
    # a PeerError after COMMLIB_TIMEOUT, not a stuck check.
    for ok, paths in pool(4, env={"COMMLIB_DEVICE_PATH": path, "COMMLIB_TIMEOUT": "30"}).run(
            _torch_kernel_path, path, timeout=100):
        assert ok and paths == [path], (ok, paths)
