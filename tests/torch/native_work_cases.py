"""Rank side of tests/torch/test_torch_native_calls.py's check of the works the C++ backend
(commlib._C_torch) returns for blocking calls: CommlibBackend::done_work's reuse and weak hold."""
from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist

from backend_cases import setup


def case_blocking_works(comm):
    """A blocking call's work (CommlibBackend::done_work): reused once torch's wrapper has dropped it
    (50 blocking all_reduce, broadcast and barrier make at most one work between them), a new one
    while a caller still holds the last; it holds its tensors weakly (a tensor the caller dropped is
    freed, and result() gives those still held), and the work the backend keeps for reuse holds none."""
    world = setup(comm)["world"]
    backend = world._get_backend(torch.device("cpu"))
    P, r = comm.size, comm.rank
    t = torch.full((8,), float(r))
    made = backend._blocking_works_made
    for _ in range(50):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.broadcast(t, src=P - 1)
        dist.barrier()
    assert torch.equal(t, torch.full((8,), float(P - 1))), t
    assert backend._blocking_works_made - made <= 1, backend._blocking_works_made - made

    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    a, b = torch.full((4,), float(r)), torch.full((4,), float(r + 1))
    made = backend._blocking_works_made
    wa = world.allreduce([a], opts)
    wb = world.allreduce([b], opts)  # wa still held: not reused
    assert wa is not wb and backend._blocking_works_made - made >= 1
    assert wa.wait() and wa.is_completed() and wa.is_success() and wb.wait()
    (ra,), (rb,) = wa.result(), wb.result()
    assert ra.data_ptr() == a.data_ptr() and rb.data_ptr() == b.data_ptr()
    assert torch.equal(ra, torch.full((4,), float(P * (P - 1) // 2)))
    assert torch.equal(wb.get_future().wait()[0], torch.full((4,), float(P * (P + 1) // 2)))

    c = torch.ones(4)
    dead = weakref.ref(c)
    wc = world.allreduce([c], opts)
    del c
    gc.collect()
    assert dead() is None and wc.result() == [], "a blocking call's work kept its tensor alive"
    d = torch.ones(4)
    dead = weakref.ref(d)
    dist.all_reduce(d)  # its work is the backend's spare now
    del d
    gc.collect()
    assert dead() is None, "the spare work kept its tensor alive"
    return True
