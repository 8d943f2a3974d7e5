"""What a newcomer to a data-parallel group needs besides the parameters and buffers: the
optimizer's state (momentum, Adam's moments and step, the param groups' hyperparameters), sent
from one rank to all (``DataParallel.grow`` and ``DataParallel.joined``), and the small
description of sharded state the sharded wrappers' grow sends first (``_reshard.py``)."""
from __future__ import annotations

import io

import torch


def _check_optimizer(optimizer):
    if optimizer is not None and not (callable(getattr(optimizer, "state_dict", None))
                                      and callable(getattr(optimizer, "load_state_dict", None))):
        raise TypeError(f"optimizer: expected a torch.optim.Optimizer (state_dict/load_state_dict) or None, "
                        f"got {type(optimizer).__name__}")


def broadcast_object(comm, obj, src: int = 0):
    """``src``'s ``obj`` (tensors and plain values: dicts, lists, tuples, numbers, strings, None) on
    every rank (collective over ``comm``; the others pass anything, e.g. None). It travels as
    ``torch.save`` bytes read with ``torch.load(weights_only=True)``: never code; tensors load on
    the CPU. ``None`` on ``src`` sends nothing and returns None everywhere."""
    payload = b""
    if comm.rank == src and obj is not None:
        buf = io.BytesIO()
        torch.save(obj, buf)
        payload = buf.getvalue()
    size = torch.tensor([len(payload)], dtype=torch.int64)
    comm.broadcast(size, root=src)
    n = int(size.item())
    if n == 0:
        return None
    if comm.rank == src:
        comm.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), root=src)
        return obj
    data = torch.empty(n, dtype=torch.uint8)
    comm.broadcast(data, root=src)
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=True)


def broadcast_optimizer_state(comm, optimizer, src: int = 0):
    """``src``'s ``optimizer.state_dict()`` loaded into every other rank's ``optimizer``
    (collective over ``comm``). ``src`` with no optimizer sends nothing, and a rank that then
    passed one raises ValueError (every rank raises the same way: the size went first); a rank
    with none receives and drops it. The state travels as ``torch.save`` bytes and is read with
    ``torch.load(weights_only=True)``: tensors and plain values only, never code; tensors load
    on the CPU and ``load_state_dict`` moves them to each parameter's device and dtype."""
    _check_optimizer(optimizer)
    state = broadcast_object(comm, optimizer.state_dict() if comm.rank == src and optimizer is not None
                             else None, src)
    if state is None:
        if optimizer is not None and comm.rank != src:
            raise ValueError(f"optimizer: rank {src} passed none, so there is no state to receive "
                             "(pass the optimizer on every rank, or on none)")
        return
    if comm.rank != src and optimizer is not None:
        optimizer.load_state_dict(state)
