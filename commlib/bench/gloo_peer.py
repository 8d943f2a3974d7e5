"""Peer: gloo through torch.distributed, same sizes, world size and timing as commlib.

all_reduce and broadcast run in place (torch has no out-of-place form), the others out of place:
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, reduce, gather, scatter.
"""
from __future__ import annotations

import functools

import numpy as np

from commlib.bench.backends import Backend

_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG",
        "band": "BAND", "bor": "BOR", "bxor": "BXOR"}


def _t(buf):
    import torch
    if buf is None or isinstance(buf, torch.Tensor):
        return buf
    return torch.from_numpy(buf)


class GlooBackend(Backend):
    name = "gloo"
    transport = "tcp"

    def __init__(self, rank=None, world_size=None):
        import warnings

        import torch.distributed as dist
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch")
        warnings.filterwarnings("ignore", message=".*deprecated.*")
        self.dist = dist
        if not dist.is_initialized():
            kw = {}
            if rank is not None:
                kw = {"rank": rank, "world_size": world_size}
            dist.init_process_group("gloo", **kw)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def supports(self, collective, mode, op, dtype):
        return op in _OPS or collective not in ("all_reduce", "reduce_scatter", "reduce")

    def make(self, collective, algorithm, mode, bufs, op, root):
        d = self.dist
        s, r = _t(bufs["send"]), _t(bufs["recv"])
        rop = getattr(d.ReduceOp, _OPS.get(op, "SUM"))
        P = self.size
        if collective == "all_reduce":
            return functools.partial(d.all_reduce, s, rop)
        if collective == "all_gather":
            return functools.partial(d.all_gather_into_tensor, r, s)
        if collective == "reduce_scatter":
            return functools.partial(d.reduce_scatter_tensor, r, s, rop)
        if collective == "all_to_all":
            return functools.partial(d.all_to_all_single, r, s)
        if collective == "broadcast":
            return functools.partial(d.broadcast, s, root)
        if collective == "reduce":
            return functools.partial(d.reduce, s, root, rop)
        if collective == "gather":
            lst = list(r.chunk(P)) if r is not None else None
            return functools.partial(d.gather, s, lst, root)
        if collective == "scatter":
            lst = list(s.chunk(P)) if s is not None else None
            return functools.partial(d.scatter, r, lst, root)
        raise ValueError(collective)

    def barrier(self):
        self.dist.barrier()

    def gather_stats(self, vec):
        import torch
        v = torch.from_numpy(np.ascontiguousarray(vec, dtype=np.float64))
        out = torch.empty(v.numel() * self.size, dtype=torch.float64)
        self.dist.all_gather_into_tensor(out, v)
        return out.numpy().reshape(self.size, v.numel())

    def close(self):
        try:
            self.dist.destroy_process_group()
        except Exception:
            pass
