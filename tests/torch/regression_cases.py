"""Rank-side cases for the four causes of #12 (run by commlib.testing rank pools; see backend_cases)."""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from backend_cases import setup


def case_all_gather_coalesced_layout(comm):
    """output_lists[r][i] is rank r's i-th input, as on gloo; equal counts once came back
    transposed, unequal ones raised."""
    st = setup(comm)
    P, r = comm.size, comm.rank
    for n_inputs in (P, 2, 1):  # n_inputs == P: the case that was silently transposed
        ins = [torch.full((i + 1,), 10 * r + i, dtype=torch.int64) for i in range(n_inputs)]
        got = [[torch.empty(i + 1, dtype=torch.int64) for i in range(n_inputs)] for _ in range(P)]
        want = [[torch.empty(i + 1, dtype=torch.int64) for i in range(n_inputs)] for _ in range(P)]
        dist.all_gather_coalesced(got, ins)
        dist.all_gather_coalesced(want, ins, group=st["gloo"])
        for q in range(P):
            for i in range(n_inputs):
                assert torch.equal(got[q][i], want[q][i]), (n_inputs, q, i, got, want)
                assert int(got[q][i][0]) == 10 * q + i, (n_inputs, q, i, got)
    return P


def case_sparse_all_reduce(comm):
    """Sparse COO all_reduce (SUM) equals gloo's, with a different number of non-zeros per rank."""
    st = setup(comm)
    P, r = comm.size, comm.rank
    idx = torch.tensor([[r, (r + 1) % 5, 4], [0, 2, r % 3]])
    val = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])[: r % 3 + 1] * (r + 1)
    base = torch.sparse_coo_tensor(idx[:, : r % 3 + 1], val, (5, 3, 2))
    got, want = base.clone(), base.clone()
    dist.all_reduce(got)
    dist.all_reduce(want, group=st["gloo"])
    assert got.is_sparse
    assert torch.equal(got.to_dense(), want.to_dense()), (got, want)
    try:
        dist.all_reduce(base.clone(), op=dist.ReduceOp.MAX)
    except ValueError as exc:
        assert "SUM" in str(exc), exc
    else:
        raise AssertionError("sparse MAX accepted")
    return float(got.to_dense().sum())


def case_barrier_timeout_message(comm):
    """Only rank 0 enters a barrier on a group created with timeout=1 s: it raises after about
    1 s, in words torch users match (" timeout "), without blaming COMMLIB_TIMEOUT."""
    setup(comm)
    g = dist.new_group(timeout=datetime.timedelta(seconds=1))
    if comm.rank == 0:
        t0 = time.monotonic()
        try:
            dist.barrier(group=g)
        except Exception as exc:  # noqa: BLE001 - inspected below
            elapsed, msg = time.monotonic() - t0, str(exc)
        else:
            raise AssertionError("barrier alone did not time out")
        assert 0.9 <= elapsed < 10, elapsed
        assert " timeout " in msg and "COMMLIB_TIMEOUT" not in msg, msg
        assert "rank 1" in msg or "rank 2" in msg, msg
    comm.barrier()  # the others wait until rank 0 is done
    dist.destroy_process_group(g)
    return True


def case_recv_any_source(comm):
    """dist.recv/irecv without src receive from every other rank and name the sender."""
    setup(comm)
    P, r = comm.size, comm.rank
    senders = []
    if r == 0:
        for _ in range(P - 1):
            t = torch.full((6,), -1.0)
            src = dist.recv(t)
            assert torch.equal(t, torch.full((6,), float(src))), (src, t)
            senders.append(src)
        assert sorted(senders) == list(range(1, P)), senders
    else:
        dist.send(torch.full((6,), float(r)), 0)
    # Rank P - 1's second message only after every first one was received: sends are buffered,
    # so without this it could overtake rank 1's first and be received by the loop above.
    dist.barrier()
    if r == 0:
        t = torch.empty(6)
        w = dist.irecv(t)
        w.wait()
        assert torch.equal(t, torch.full((6,), float(P - 1))), t
        senders.append(w._source_rank())
    elif r == P - 1:
        dist.send(torch.full((6,), float(r)), 0)
    dist.barrier()
    return senders


def case_blocking_work_values(comm):
    """The blocking fast path reuses its completed Work only when nobody kept it: a kept work's
    future still holds its own call's tensors after later calls."""
    setup(comm)
    pg = dist.group.WORLD
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    a, b = torch.ones(3), torch.full((3,), 2.0)
    wa = pg.allreduce([a], opts)
    wb = pg.allreduce([b], opts)
    assert wa is not wb
    assert wa.get_future().value()[0] is a and wb.get_future().value()[0] is b
    assert wa.wait() and wa.is_completed() and wa.exception() is None
    assert torch.equal(a, torch.full((3,), float(comm.size)))
    assert torch.equal(b, torch.full((3,), 2.0 * comm.size))
    # a tensor the fast path does not take (non-contiguous) still goes through the general path
    c = torch.ones(4, 2).t()
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((2, 4), float(comm.size)))
    return True
