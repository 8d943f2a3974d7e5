"""One ZeRO-3 unit of :class:`commlib.parallel.fully_sharded.FullyShardedModule`: its fp32 shard,
the gathered flat parameters and their life cycle (free -> gathering -> gathered -> free), and the
autograd function that hands the unit's flat gradient back to its owner's reduce-scatter."""
from __future__ import annotations

from typing import List

import torch

from ._buckets import FlatLayout
from .zero_checkpoint import _Unit

FREE, GATHERING, GATHERED = 0, 1, 2  # a unit's gathered parameters


class FsdpUnit(_Unit):
    """A unit's shard (an nn.Parameter), its full flat buffer (storage freed while FREE) and the
    all_gather that fills it."""

    def __init__(self, name, module, params, owner):
        comm = owner.comm
        layout = FlatLayout([n for n, _ in params], [p.shape for _, p in params], comm.size)
        super().__init__(name, layout, comm.rank)
        self.module = module
        self.owner = owner
        self.param_names = [n for n, _ in params]
        flat = torch.zeros(layout.padded, dtype=torch.float32, device=params[0][1].device)
        with torch.no_grad():
            for (_, p), v in zip(params, layout.views(flat)):
                v.copy_(p.detach())
        self.shard = torch.nn.Parameter(flat[layout.piece * comm.rank:
                                             layout.piece * (comm.rank + 1)].clone())
        self.orig_dtypes = [p.dtype for _, p in params]
        self.full = torch.empty(layout.padded, dtype=owner.compute_dtype, device=flat.device)
        self._nbytes = self.full.untyped_storage().nbytes()
        self.full.untyped_storage().resize_(0)
        self.state = FREE
        self.work = None
        self.locations = []          # per parameter: [(submodule, attribute), ...]
        self.bw_hooked = False

    def relayout(self, comm):
        """Lay the unit out for ``comm``'s size and rank (a grow or a shrink): the shard (the same
        Parameter, so the optimizer's references hold) becomes a zero piece of the new size, which
        the grow's move or the checkpoint's load fills; the gathered buffer gets the new padded size."""
        assert self.state == FREE, "relayout of a gathered unit"  # the callers free or discard first
        layout = FlatLayout(self.layout.names, self.layout.shapes, comm.size)
        with torch.no_grad():
            self.shard.data = torch.zeros(layout.piece, dtype=self.shard.dtype, device=self.shard.device)
        self.full = torch.empty(layout.padded, dtype=self.full.dtype, device=self.full.device)
        self._nbytes = self.full.untyped_storage().nbytes()
        self.full.untyped_storage().resize_(0)
        self.set_layout(layout, comm.rank)

    def gather_async(self):
        assert self.state == FREE
        self.full.untyped_storage().resize_(self._nbytes)
        src = self.shard.detach()
        if self.full.dtype != src.dtype:
            src = src.to(self.full.dtype)
        self.work = self.owner.comm.all_gather(self.full, src, algorithm=self.owner.algorithm,
                                               async_op=True)
        self.state = GATHERING

    def ensure_gathered(self):
        if self.state == FREE:
            self.gather_async()
        if self.state == GATHERING:
            self.work.wait()
            self.work = None
            self.state = GATHERED

    def discard(self):
        """Forget the gathered buffer and an all_gather in flight without waiting for it: after a
        peer died its communicator is aborted, and waiting would raise that error again."""
        self.work = None
        self.full.untyped_storage().resize_(0)
        self.state = FREE

    def free(self):
        if self.state == GATHERING:
            self.work.wait()
            self.work = None
        self.full.untyped_storage().resize_(0)
        self.state = FREE


class GatherParams(torch.autograd.Function):
    """Forward: the unit's gathered flat parameters (already all-gathered into ``unit.full``).
    Backward: hands the flat gradient to the unit's reduce-scatter; the shard's gradient is
    accumulated at the end of backward when the asynchronous reduce-scatter has completed."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        # ``.data``: an alias with its own version counter, so re-gathering into the same storage
        # before backward is not mistaken for an in-place change of saved tensors.
        return unit.full.data

    @staticmethod
    def backward(ctx, grad_full):
        unit = ctx.unit
        unit.owner._post_backward(unit, grad_full)
        return None, None


def default_policy(root: torch.nn.Module) -> List[str]:
    """FullyShardedModule's default units: every direct child that has parameters."""
    return [n for n, m in root.named_children() if any(True for _ in m.parameters())]


def check_floats(named):
    """FSDP shards floating-point parameters only (their gradients are averaged)."""
    for n, p in named:
        if not p.dtype.is_floating_point:
            raise ValueError(f"parameter '{n}': dtype {p.dtype} cannot be sharded (floats only)")


def flatten(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from flatten(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from flatten(v)
