"""The parameter-server pattern: one server rank owns the optimizer; the others push gradients
and pull weights.

This is the *baseline*, kept to be measured against. Every step the server receives a full
gradient from each of the N-1 workers (push: a ``reduce`` rooted at the server, by default the
``direct`` algorithm, i.e. every worker sends to the server) and sends the full weights back to
each of them (pull: one point-to-point send per worker, or a ``broadcast`` with ``pull=
"broadcast"``): the server's link carries 2(N-1)·Ψ elements per step, O(N), while a ring
all-reduce moves 2(N-1)/N·Ψ per rank, O(1) — which is why DataParallel (all-reduce) replaced it.
Tree algorithms for the push and pull remove the server hot spot but not the latency of two
dependent phases, and the server still holds the whole optimizer state (16Ψ with Adam) while the
workers hold 8Ψ.

Usage (every rank)::

    ps = ParameterServer(model, comm, torch.optim.SGD, lr=0.1)   # rank 0 is the server
    loss_fn(model(x_local), y_local).backward()
    ps.step()          # push (reduce to the server), server steps, pull (broadcast)
    ps.zero_grad()
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from commlib.core.call_checks import as_rank

from ._buckets import (FlatLayout, broadcast_tensors, check_algorithm, check_comm,
                       check_one_device, check_same_structure, optimizer_state_tensors,
                       storage_bytes, unique_named_parameters)


class ParameterServer:
    """Synchronous parameter server over ``comm``.

    Args:
        module: the model (identical architecture on every rank).
        comm: the communicator; ``server_rank`` is one of its ranks.
        optimizer_class: a torch optimizer class, built on the server only with
            ``**optimizer_kwargs``.
        server_rank: the rank that keeps the optimizer (default 0).
        server_computes: whether the server also trains on a slice of the batch (default True).
            With False the server only aggregates, and the gradient is averaged over the
            ``size - 1`` workers.
        reduce_algorithm: algorithm of the push (``"direct"``: every worker sends to the server,
            the textbook pattern; ``"binomial"`` or ``"auto"`` for a tree).
        pull: ``"p2p"`` (the server sends the weights to each worker: O(N) at the server) or
            ``"broadcast"`` (a ``broadcast`` collective with ``broadcast_algorithm``).

    Parameters and gradients live in one flat buffer per dtype (``param.data``/``param.grad``
    are views into them), so a push is one ``reduce`` and a pull one ``broadcast`` per dtype.

    The flat buffers (and the server's optimizer state) stay on the module's device: the CPU, or
    one CUDA device, whose pushes and pulls the communicator enqueues on the current stream (the
    server's division and optimizer step follow on that stream, so nothing waits on the host).
    Every rank's module must be on the same kind of device.
    """

    def __init__(self, module: torch.nn.Module, comm, optimizer_class, server_rank: int = 0,
                 server_computes: bool = True, reduce_algorithm: str = "direct",
                 pull: str = "p2p", broadcast_algorithm: str = "auto", **optimizer_kwargs):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        check_comm(comm)
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class: expected a torch.optim.Optimizer subclass, got "
                            f"{optimizer_class!r}")
        server_rank = as_rank(server_rank, "server_rank", comm.size)  # np.int64 passes, True does not
        if not server_computes and comm.size < 2:
            raise ValueError("server_computes: False needs at least one worker (size >= 2)")
        if pull not in ("p2p", "broadcast"):
            raise ValueError(f"pull: expected 'p2p' or 'broadcast', got {pull!r}")
        self.pull = pull
        self.reduce_algorithm = check_algorithm("reduce", reduce_algorithm)
        self.broadcast_algorithm = check_algorithm("broadcast", broadcast_algorithm)
        self.module, self.comm = module, comm
        self.server_rank = server_rank
        self.server_computes = bool(server_computes)
        self.is_server = comm.rank == server_rank
        named = unique_named_parameters(module)
        buffers = list(module.named_buffers())
        device = check_one_device(named, "parameter")
        check_one_device(buffers, "buffer", device)
        specs = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
        specs += [("buffer:" + n, tuple(b.shape), str(b.dtype)) for n, b in buffers]
        check_same_structure(comm, specs, "parameter")
        broadcast_tensors(comm, [p.data for _, p in named] + [b for _, b in buffers], src=server_rank)
        trainable = [p for _, p in named if p.requires_grad]
        self._groups = []       # (params, layout, flat params, flat grads) per dtype
        by_dtype = {}
        for p in trainable:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            layout = FlatLayout([str(i) for i in range(len(ps))], [p.shape for p in ps], 1)
            flat = torch.empty(layout.numel, dtype=dtype, device=device)
            grad = torch.zeros(layout.numel, dtype=dtype, device=device)
            with torch.no_grad():
                for p, v, g in zip(ps, layout.views(flat), layout.views(grad)):
                    v.copy_(p.detach())
                    p.data = v
                    p.grad = g
            self._groups.append((ps, layout, flat, grad))
        self.optimizer = optimizer_class(trainable, **optimizer_kwargs) if self.is_server else None
        self.workers = comm.size - (0 if self.server_computes else 1)

    @property
    def param_groups(self):
        """The server optimizer's param groups (an empty list on workers)."""
        return self.optimizer.param_groups if self.optimizer is not None else []

    def zero_grad(self, set_to_none: bool = True):
        """Zero the flat gradient buffer (gradients stay views of it)."""
        for ps, layout, _, grad in self._groups:
            grad.zero_()
            for p, g in zip(ps, layout.views(grad)):
                p.grad = g

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None):
        """Push gradients to the server (reduce, sum), server averages and steps, pull weights
        (broadcast from the server)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for ps, layout, _, grad in self._groups:
            for p, g in zip(ps, layout.views(grad)):
                if p.grad is None:
                    g.zero_()
                elif p.grad.data_ptr() != g.data_ptr():
                    g.copy_(p.grad)
                p.grad = g
            if not self.server_computes and self.is_server:
                grad.zero_()          # the server contributes nothing
            self.comm.reduce(grad, root=self.server_rank, op="sum", algorithm=self.reduce_algorithm)
        if self.is_server:
            for _, _, _, grad in self._groups:
                grad.div_(self.workers)
            self.optimizer.step()
        for _, _, flat, _ in self._groups:
            if self.comm.size == 1 or not flat.numel():
                continue
            if self.pull == "broadcast":
                self.comm.broadcast(flat, root=self.server_rank, algorithm=self.broadcast_algorithm)
            elif self.is_server:
                self.comm.batch_p2p([("send", flat, r) for r in range(self.comm.size)
                                     if r != self.server_rank])
            else:
                self.comm.recv(flat, self.server_rank)
        return loss

    def state_dict(self) -> dict:
        """The server optimizer's state_dict (``{}`` on workers)."""
        return self.optimizer.state_dict() if self.optimizer is not None else {}

    def load_state_dict(self, state: dict):
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)

    def memory_breakdown(self) -> dict:
        """Bytes this rank holds for parameters, gradients and optimizer state."""
        return {"params": storage_bytes(f for _, _, f, _ in self._groups),
                "grads": storage_bytes(g for _, _, _, g in self._groups),
                "optimizer": storage_bytes(optimizer_state_tensors(self.optimizer)),
                "comm_buffers": 0}
