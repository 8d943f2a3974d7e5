"""Rank side of test_a2av_split_numbering.py: ``dist.all_to_all_single`` with split sizes over the
C++ backend is the core's all_to_all numbered as a collective (``all_to_allv``), as commlib's own
routes number it. So a rank killed under one is named with ``all_to_all #n`` by every survivor (not
a message of the batch, ``send #n``), and the call takes one call number on every route: ranks that
make it through torch meet ranks that make it through the group's commlib communicator, and the
calls after it agree."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

import commlib
from commlib.testing.faults import arm_death

import backend_cases as bc


def _init(comm):
    """The default "commlib" group over the pool's ranks, on the C++ backend: backend_cases.setup's,
    the one every torch case module of a shared pool meets (a group of this module's own would make
    theirs fail: torch allows one default group a process)."""
    from commlib.torch import native
    assert native.load() is not None, "commlib._C_torch is not built"
    bc.setup(comm)


def _buffers(me: int, P: int, rows: int = 2):
    """Awkward split sizes (rank r sends r + j + 1 rows to rank j: a different size per pair, a
    prime among them) and rank-tagged input; (output, input, output splits, input splits)."""
    ins = [me + j + 1 for j in range(P)]
    outs = [r + me + 1 for r in range(P)]
    x = (torch.arange(sum(ins) * rows, dtype=torch.float32) + 1000 * me).reshape(sum(ins), rows)
    return torch.zeros(sum(outs), rows), x, outs, ins


def _expected(me: int, P: int, rows: int = 2) -> torch.Tensor:
    """What rank ``me`` receives: from each rank r the block r sends to ``me``."""
    blocks = []
    for r in range(P):
        _, x, _, ins = _buffers(r, P, rows)
        start = sum(ins[:me])
        blocks.append(x[start:start + ins[me]])
    return torch.cat(blocks)


def kill_during_all_to_all_single(comm, victim: int, async_op: bool):
    """On a fresh commlib group, ``victim`` dies under the group's third call, an all_to_all_single
    with split sizes (the first is another, the second an all_reduce). A survivor returns
    (message, seconds); None on the victim."""
    _init(comm)
    g = dist.new_group(backend="commlib")
    me, P = dist.get_rank(), dist.get_world_size()
    y, x, outs, ins = _buffers(me, P)
    dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins, group=g)  # #1
    assert torch.equal(y, _expected(me, P)), (me, y)
    dist.all_reduce(torch.ones(5), group=g)  # #2
    # (the victim never makes the call: a rank sends its blocks at once, so a victim inside the
    # call could have delivered all its peers need before it dies)
    if arm_death(comm, victim):
        time.sleep(5)  # the kill arrives meanwhile
        return None
    t = time.monotonic()
    try:
        w = dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins, group=g,
                                   async_op=async_op)  # #3
        if async_op:
            w.wait()
        return "no error", time.monotonic() - t
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t
    except Exception as e:  # noqa: BLE001
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t


def case_routes_number_alike(comm):
    """The ranks of a fresh group make the same all_to_all with split sizes, the even ranks through
    torch (the C++ backend) and the odd ones through the group's Python backend (commlib's own
    route: the communicator's all_to_all with split sizes, on the tensors' bytes), blocking and
    async; then an all_reduce through torch, an all_to_all_single through torch on every rank, and
    one through the communicator on every rank (bytes, as the Python backend passes them). Every
    result exact; returns the all_reduce's value."""
    import commlib.torch as ct
    _init(comm)
    g = dist.new_group(backend="commlib")
    me, P = dist.get_rank(), dist.get_world_size()
    want = _expected(me, P)
    for async_op in (False, True):
        y, x, outs, ins = _buffers(me, P)
        if me % 2 == 0:
            w = dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins, group=g,
                                       async_op=async_op)
        else:
            opts = dist.AllToAllOptions()
            opts.asyncOp = async_op
            w = ct.python_group(g).alltoall_base(y, x, outs, ins, opts)
        if async_op:
            w.wait()
        assert torch.equal(y, want), (me, async_op, y)
    s = torch.full((3,), float(me + 1))
    dist.all_reduce(s, group=g)
    y, x, outs, ins = _buffers(me, P)
    dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins, group=g)
    assert torch.equal(y, want), (me, y)
    y.zero_()
    row = x.element_size() * x.shape[1]  # bytes a row
    ct.get_communicator(g).all_to_all(y.view(-1).view(torch.uint8), x.view(-1).view(torch.uint8),
                                      output_splits=[row * k for k in outs],
                                      input_splits=[row * k for k in ins])
    assert torch.equal(y, want), (me, y)
    dist.destroy_process_group(g)
    return s.tolist()


DEVICE = 6  # an emulated device no other case of these processes sets an engine up on


def kill_during_device_exchange(comm, victim: int):
    """The CUDA branch (device_exchange: the stream engine's batch, numbered through core_api.h's
    device_all_to_allv) on emulated memory through the backend's test seam: an uneven all_to_all
    (its first call sets the engine up from C++), a host all_reduce, then ``victim`` dies under the
    third call, another uneven all_to_all. A survivor returns (message, seconds, whether the first
    call was right); None on the victim."""
    import numpy as np

    import commlib.emulated as emu
    from commlib.torch import native
    from commlib.torch.backend import ProcessGroupCommlib
    sub = comm.split(0, timeout=30)
    P, r = sub.size, sub.rank
    pg = ProcessGroupCommlib(sub, r, P)
    backend = native.wrap(pg)
    ins, outs = [r + j + 1 for j in range(P)], [q + r + 1 for q in range(P)]
    src = emu.from_numpy(np.concatenate([np.arange(ins[j], dtype=np.float32) + 1000 * r + 100 * j
                                         for j in range(P)]), device_index=DEVICE)
    dst = emu.from_numpy(np.full(sum(outs), -1, np.float32), device_index=DEVICE)
    want = np.concatenate([np.arange(outs[q], dtype=np.float32) + 1000 * q + 100 * r for q in range(P)])

    def exchange():
        emu.current_stream(DEVICE).synchronize()  # (the seam's own block is copied by the host)
        w = backend._device_exchange(src.data_ptr(), dst.data_ptr(), [4 * k for k in ins], [4 * k for k in outs],
                                     DEVICE, 0)
        w.wait()
        w.synchronize()

    exchange()  # #1 (the engine set up from C++ first)
    right = bool((dst.numpy() == want).all())
    sub.all_reduce(np.ones(4, np.float32))  # #2, on the host
    if arm_death(sub, victim):
        time.sleep(5)  # the kill arrives meanwhile
        return None
    t = time.monotonic()
    try:
        exchange()  # #3
        return "no error", time.monotonic() - t, right
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t, right
    except Exception as e:  # noqa: BLE001
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t, right
