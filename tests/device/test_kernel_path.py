"""The kernel path (COMMLIB_DEVICE_PATH=kernel: one kernel launch per collective interpreting the
rank's device plan, csrc/stream/kernel_path.h) on the emulated device, whose blocks run on host
threads concurrently, with the stream delay on (it also perturbs every item of every block) and
every rank of a pool sharing emulated device 0.

The same covering selection as the copy path's matrix (test_device_collectives.py): every
collective x algorithm (auto included) x two of the counts 0, 1, P-1, 13, 97 at world sizes 1-5
and 8, dtypes, ops, roots and placement rotating; every dtype x op at size 3; one ~1M-element call
per collective at size 3 (forced onto the kernel path: auto would take the copy path above
1 MiB). Small slots (COMMLIB_DEVICE_SLOT_BYTES=4096, 2 slots) make large calls hundreds of chunks
through few slots, so slot reuse and the flags' order are exercised. Then errors on the kernel
path: mismatched calls, a killed rank, a silent peer (the abort word releases the kernel), and
the auto/kernel/copy choice itself."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
import device_error_cases as cases  # noqa: E402
from test_device_collectives import big_cases, covering_cases, dtype_op_sweep  # noqa: E402

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

KERNEL = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_DEVICE_PATH": "kernel",
          "COMMLIB_DEVICE_SLOT_BYTES": "4096", "COMMLIB_DEVICE_SLOTS": "2"}


def _path_of_cases(comm, cases_):
    """check_cases, plus the path the last call ran on."""
    out = device_cases.check_cases(comm, cases_)
    return out[0], out[1], comm._device_route.last_path()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_collective_matrix_on_the_kernel_path(pool, size):
    selected = covering_cases(size)
    if size == 3:
        selected += dtype_op_sweep(size)
    if size == 3:
        selected += big_cases(size)
    results = pool(size, env=KERNEL).run(_path_of_cases, selected, timeout=240)
    device_cases.check_results([(f, d) for f, d, _ in results])
    assert {p for _, _, p in results} == {"kernel"}, results[0][2]


def _paths(comm):
    """The path auto takes for a small and a large all_reduce."""
    import numpy as np

    import commlib.emulated as emu
    out = []
    for n in (1000, (1 << 20) // 4 + 1):  # 4 000 bytes; one element over 1 MiB
        x = emu.from_numpy(np.ones(n, np.float32))
        comm.all_reduce(x)
        out.append((comm._device_route.last_path(), bool((x.numpy() == comm.size).all())))
    return out


@pytest.mark.parametrize("setting,want", [("auto", ["kernel", "copy"]), ("copy", ["copy", "copy"]),
                                          ("kernel", ["kernel", "kernel"])])
def test_auto_chooses_by_size_and_the_setting_forces(pool, setting, want):
    env = {"COMMLIB_DEVICE_PATH": setting, "COMMLIB_EMULATED_DELAY_US": "20"}
    for res in pool(2, env=env).run(_paths):
        assert res == [(w, True) for w in want], res


@pytest.mark.timeout(90)
@pytest.mark.parametrize("scenario", ["collective", "count"])
def test_mismatch_raises_on_every_rank_on_the_kernel_path(pool, scenario):
    for rank, (msg, took, later, names) in enumerate(pool(3, env=KERNEL).run(cases.mismatch, scenario, timeout=60)):
        assert msg is not None, f"rank {rank} got no error"
        assert all(n in msg for n in names), f"rank {rank}: message does not name both calls: {msg}"
        assert took < 20, f"rank {rank} took {took:.1f} s"
        assert later is not None and later < 1.0, f"rank {rank}: aborted communicator did not fail at once"


@pytest.mark.timeout(90)
def test_killed_peer_raises_peer_error_on_the_kernel_path():
    results = run_killing_one_rank(3, 0, cases.kill_during_collective, env=KERNEL, timeout=60)
    assert_survivors_named_the_dead_rank(results, 0, within_s=20)


@pytest.mark.timeout(60)
def test_silent_peer_times_out_and_the_abort_word_releases_the_kernel(pool):
    res = pool(2, env=KERNEL).run(cases.silent_peer, timeout=40)
    msg, took = res[0]
    assert "rank 1" in msg and "all_reduce" in msg and "COMMLIB_TIMEOUT" in msg, msg
    assert 1.0 < took < 10, took
    assert res[1][0].startswith(("PeerError", "CommError")), res[1]


def _mixed_paths(comm):
    """Rank 1 creates its engine with COMMLIB_DEVICE_PATH=copy, rank 0 with kernel."""
    import numpy as np

    import commlib.emulated as emu
    old = os.environ.get("COMMLIB_DEVICE_PATH")
    os.environ["COMMLIB_DEVICE_PATH"] = "copy" if comm.rank == 1 else "kernel"
    sub = comm.split(0, timeout=20)
    try:
        x = emu.from_numpy(np.ones(4, np.float32))
        sub.all_reduce(x)
        x.numpy()
        return "no error"
    except ValueError as e:
        return str(e)
    finally:
        os.environ["COMMLIB_DEVICE_PATH"] = old
        sub.close()


def test_ranks_with_different_paths_are_refused(pool):
    for msg in pool(2, env={"COMMLIB_DEVICE_PATH": "kernel"}).run(_mixed_paths, timeout=40):
        assert "COMMLIB_DEVICE_PATH" in msg and "every rank must use the same" in msg, msg


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
