"""Rank-side cases of the torch backend: errors through the torch API (mismatched calls, a killed
rank) and the backend's options (set-up: backend_cases.py)."""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from backend_cases import setup


# -- errors -----------------------------------------------------------------------------------------
def case_mismatch(comm):
    """A fresh commlib group; rank 0 all_reduces while the others broadcast: both must raise."""
    setup(comm)
    g = dist.new_group(backend="commlib")
    x = torch.ones(4)
    try:
        if comm.rank == 0:
            dist.all_reduce(x, group=g)
        else:
            dist.broadcast(x, src=0, group=g)
    except Exception as exc:  # noqa: BLE001
        msg = f"{type(exc).__name__}: {exc}"
    else:
        msg = None
    # asynchronous: the error comes through wait() / the future
    g2 = dist.new_group(backend="commlib")
    try:
        if comm.rank == 0:
            w = dist.all_reduce(torch.ones(3), group=g2, async_op=True)
        else:
            w = dist.all_gather_into_tensor(torch.ones(3 * comm.size), torch.ones(3), group=g2,
                                            async_op=True)
        w.wait()
    except Exception as exc:  # noqa: BLE001
        msg2 = f"{type(exc).__name__}: {exc}"
    else:
        msg2 = None
    return msg, msg2


def killed_rank_main(rank, size, port, result_path):
    """Entry point for a spawned process (not the pool): rank 1 dies after init."""
    import commlib.torch  # noqa: F401
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=5))
    x = torch.ones(8)
    dist.all_reduce(x)
    if rank == 1:
        os._exit(3)
    import time
    t0 = time.monotonic()
    try:
        for _ in range(3):
            dist.all_reduce(x)
            time.sleep(0.2)
        msg = "no error"
    except Exception as exc:  # noqa: BLE001
        msg = f"{type(exc).__name__}: {exc}"
    with open(result_path, "w") as f:
        f.write(f"{time.monotonic() - t0:.2f}\n{msg}")
    os._exit(0)


# -- options ----------------------------------------------------------------------------------------
def case_options(comm):
    """pg_options picks algorithms per collective; bad names are refused; the timeout is passed."""
    import commlib.torch as ct
    st = setup(comm)
    P, r = comm.size, comm.rank
    assert ct.get_communicator(st["world"]).timeout == 60.0, ct.get_communicator(st["world"]).timeout
    results = []
    for algo in ("ring", "recursive_doubling", "rabenseifner", "tree"):
        key = ("opt", algo)
        if key not in st:
            st[key] = dist.new_group(backend="commlib", pg_options=ct.Options(
                algorithms={"all_reduce": algo, "all_gather": "bruck", "broadcast": "pipeline"}))
        g = st[key]
        assert ct.python_group(g).options.algorithms["all_reduce"] == algo
        x = torch.arange(10, dtype=torch.int64) * (r + 1)
        dist.all_reduce(x, group=g)
        assert torch.equal(x, torch.arange(10, dtype=torch.int64) * (P * (P + 1) // 2)), algo
        out = torch.zeros(3 * P, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.full((3,), r, dtype=torch.int64), group=g)
        assert torch.equal(out, torch.arange(P).repeat_interleave(3)), out
        y = torch.full((5,), r)
        dist.broadcast(y, src=P - 1, group=g)
        assert torch.equal(y, torch.full((5,), P - 1))
        results.append(algo)
    try:
        ct.Options(algorithms={"allreduce": "ring"})
    except ValueError as exc:
        assert "allreduce" in str(exc)
    else:
        raise AssertionError("unknown collective accepted")
    from commlib.torch.backend import _check_algorithms
    try:
        _check_algorithms(ct.Options(algorithms={"all_reduce": "nope"}))
    except ValueError as exc:
        assert "nope" in str(exc) and "ring" in str(exc)
    else:
        raise AssertionError("unknown algorithm accepted")
    try:
        _check_algorithms(ct.Options(algorithms={"all_reduce": "mapped_two_shot"}))
    except ValueError as exc:
        assert "one-sided" in str(exc), exc
    else:
        raise AssertionError("a one-sided algorithm accepted")
    return results
