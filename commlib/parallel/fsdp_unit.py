"""One ZeRO-3 unit of :class:`commlib.parallel.fully_sharded.FullyShardedModule`: its fp32 shard,
the gathered flat parameters and their life cycle (free -> gathering -> gathered -> free), and the
autograd function that hands the unit's flat gradient back to its owner's reduce-scatter."""
from __future__ import annotations

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
