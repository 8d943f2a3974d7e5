"""torch.distributed backend "commlib": every dist.* call, DDP, FSDP2/HSDP, DTensor and functional
collectives against gloo in the same processes, and errors through the torch API.

Rank-side code lives in backend_collective_cases.py, backend_training_cases.py and
backend_error_cases.py, on the set-up of backend_cases.py (workers import them by module name;
this directory is put on sys.path here, and spawned workers inherit sys.path).

Tolerances (fp32): reductions whose order differs from gloo's: rtol 1e-5 / atol 1e-6 (integers
exact); DDP after 20 SGD steps vs single-process full-batch training: rtol 1e-4 / atol 1e-5 (and
bitwise equal across ranks); FSDP2/HSDP losses vs gloo: rtol 1e-5 / atol 1e-6.
"""
import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")

import backend_collective_cases as bcol  # noqa: E402
import backend_error_cases as berr  # noqa: E402
import backend_training_cases as btrain  # noqa: E402
from commlib.testing import get_pool  # noqa: E402
from commlib.bootstrap.ports import free_port  # noqa: E402
from commlib.testing.ranks import process_context  # noqa: E402


# every ReduceOp x every dtype on 2 ranks; a smaller matrix on 3 and 4 ranks (time budget)
_AR_MATRIX = {
    2: (None, None, ((7,), (3, 5), (0,))),
    3: (["float32", "int32", "bfloat16", "uint8"], None, ((7,), (3, 5))),
    4: (["float64", "int64"], None, ((3, 5),)),
}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_reduce_every_op_and_dtype(n):
    get_pool(n).run(bcol.case_allreduce, *_AR_MATRIX[n])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_dist_calls_against_gloo(n):
    get_pool(n).run(bcol.case_collectives)


@pytest.mark.parametrize("n", [2, 3])
def test_coalescing_manager(n):
    get_pool(n).run(bcol.case_coalesced)


@pytest.mark.parametrize("n", [3, 4])
def test_new_group(n):
    ranks = get_pool(n).run(bcol.case_new_group)
    assert ranks == [r // 2 for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("variant", ["plain", "find_unused", "no_sync", "hook"])
def test_ddp_matches_full_batch(n, variant):
    params = get_pool(n).run(btrain.case_ddp, variant)
    assert all(p == params[0] for p in params), "DDP parameters differ across ranks"


def test_ddp_powersgd_hook():
    """PowerSGD's callbacks wait on collectives from the completion thread."""
    params = get_pool(2).run(btrain.case_ddp, "powersgd", 6)
    assert params[0] == params[1]


def test_fsdp2_1d_two_ranks():
    losses = get_pool(2).run(btrain.case_fsdp, (2,), 6)
    assert all(len(x) == 6 for x in losses)


def test_fsdp2_1d_four_ranks():
    get_pool(4).run(btrain.case_fsdp, (4,), 4)


def test_hsdp_2d_four_ranks():
    get_pool(4).run(btrain.case_fsdp, (2, 2), 4)


@pytest.mark.parametrize("n", [2, 3])
def test_dtensor_redistribute(n):
    get_pool(n).run(btrain.case_dtensor)


@pytest.mark.parametrize("n", [2, 3])
def test_functional_collectives(n):
    get_pool(n).run(btrain.case_funcol)


def test_torch_pipelining_gpipe_equals_gloo():
    # torch.distributed.pipelining on a commlib group (its p2p through batch_isend_irecv)
    counts = get_pool(2).run(btrain.case_torch_pipeline, timeout=120)
    assert counts[0] > 0 and counts[1] > 0, counts


def test_backend_options_and_timeout():
    get_pool(3).run(berr.case_options)


def test_mismatch_raises_through_torch():
    msgs = get_pool(2).run(berr.case_mismatch)
    for sync_msg, async_msg in msgs:
        assert sync_msg is not None and "Mismatch" in sync_msg, sync_msg
        assert async_msg is not None and "Mismatch" in async_msg, async_msg


def test_killed_rank_raises_within_timeout():
    """Rank 1 dies; rank 0's next all_reduce raises (init_process_group timeout = 5 s)."""
    port = free_port()
    ctx = process_context()  # forked from the torch-preloaded server: no torch import per rank
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result")
        procs = [ctx.Process(target=berr.killed_rank_main, args=(r, 2, port, out)) for r in range(2)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join(90)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        assert os.path.exists(out), "rank 0 hung or crashed instead of raising"
        elapsed, msg = open(out).read().split("\n", 1)
    assert "PeerError" in msg or "CommError" in msg, msg
    assert float(elapsed) < 30, elapsed
