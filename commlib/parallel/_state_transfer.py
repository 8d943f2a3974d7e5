"""What a newcomer to a data-parallel group needs besides the parameters and buffers: the
optimizer's state (momentum, Adam's moments and step, the param groups' hyperparameters), sent
from one rank to all (``DataParallel.grow`` and ``DataParallel.joined``)."""
from __future__ import annotations

import io

import torch


def _check_optimizer(optimizer):
    if optimizer is not None and not (callable(getattr(optimizer, "state_dict", None))
                                      and callable(getattr(optimizer, "load_state_dict", None))):
        raise TypeError(f"optimizer: expected a torch.optim.Optimizer (state_dict/load_state_dict) or None, "
                        f"got {type(optimizer).__name__}")


def broadcast_optimizer_state(comm, optimizer, src: int = 0):
    """``src``'s ``optimizer.state_dict()`` loaded into every other rank's ``optimizer``
    (collective over ``comm``). ``src`` with no optimizer sends nothing, and a rank that then
    passed one raises ValueError (every rank raises the same way: the size went first); a rank
    with none receives and drops it. The state travels as ``torch.save`` bytes and is read with
    ``torch.load(weights_only=True)``: tensors and plain values only, never code; tensors load
    on the CPU and ``load_state_dict`` moves them to each parameter's device and dtype."""
    _check_optimizer(optimizer)
    payload = b""
    if comm.rank == src and optimizer is not None:
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        payload = buf.getvalue()
    size = torch.tensor([len(payload)], dtype=torch.int64)
    comm.broadcast(size, root=src)
    n = int(size.item())
    if n == 0:
        if optimizer is not None and comm.rank != src:
            raise ValueError(f"optimizer: rank {src} passed none, so there is no state to receive "
                             "(pass the optimizer on every rank, or on none)")
        return
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if comm.rank == src else \
        torch.empty(n, dtype=torch.uint8)
    comm.broadcast(data, root=src)
    if comm.rank != src and optimizer is not None:
        state = torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state)
