"""Differentiable collectives for the tensor- and sequence-parallel layers.

Each collective is a ``torch.autograd.Function`` whose backward is the dual collective:

=====================  ==========================  ===========================================
function               forward                     backward
=====================  ==========================  ===========================================
``copy_to_group``      identity                    all_reduce (sum)
``reduce_from_group``  all_reduce (sum)            identity
``scatter_to_group``   keep this rank's chunk      all_gather
``gather_from_group``  all_gather                  keep this rank's chunk
``all_gather``         all_gather                  reduce_scatter (sum)
``reduce_scatter``     reduce_scatter (sum)        all_gather
``all_to_all``         all_to_all                  all_to_all with the dims swapped (inverse)
=====================  ==========================  ===========================================

``gather_from_group`` is the gather whose output is consumed identically on every rank (every rank
gets the whole gradient, so its backward just keeps its chunk); ``all_gather`` is the one whose
output feeds rank-specific computation (every rank holds a partial gradient, so the backward sums
them with a reduce-scatter). Chunks are along ``dim`` and equal-sized; a size that does not divide
by the group size is refused with a ValueError.

Every tensor is made contiguous before it is communicated, in the forward and in the backward:
torch hands backward functions non-contiguous gradients whenever the forward output was used
through a transposed view, and a collective must never see (or silently mis-read) those.

The communicator ``comm`` is any commlib communicator (``rank``, ``size``, the collectives); a
``comm`` of ``None`` or of size 1 makes every function the identity.
"""
from __future__ import annotations

import torch

__all__ = ["copy_to_group", "reduce_from_group", "scatter_to_group", "gather_from_group",
           "all_gather", "reduce_scatter", "all_to_all", "all_reduce_tensor"]


def _size(comm) -> int:
    return 1 if comm is None else comm.size


def _check_divisible(n: int, comm, what: str):
    if n % comm.size:
        raise ValueError(f"{what}: size {n} does not divide evenly over the group of {comm.size} ranks")


# ---- raw (non-differentiable) helpers, along an arbitrary dim ------------------------------------
def all_reduce_tensor(x: torch.Tensor, comm, op: str = "sum") -> torch.Tensor:
    """All-reduce a contiguous copy of ``x`` (``x`` itself is left untouched) and return it."""
    buf = x.clone(memory_format=torch.contiguous_format)
    comm.all_reduce(buf, op=op)
    return buf


def _all_gather_dim(x: torch.Tensor, comm, dim: int) -> torch.Tensor:
    P = comm.size
    xm = x.movedim(dim, 0).contiguous()
    out = torch.empty((P * xm.shape[0],) + tuple(xm.shape[1:]), dtype=x.dtype, device=x.device)
    comm.all_gather(out, xm)
    return out.movedim(0, dim)


def _reduce_scatter_dim(x: torch.Tensor, comm, dim: int) -> torch.Tensor:
    P = comm.size
    _check_divisible(x.shape[dim], comm, f"reduce_scatter along dim {dim}")
    xm = x.movedim(dim, 0).contiguous()
    out = torch.empty((xm.shape[0] // P,) + tuple(xm.shape[1:]), dtype=x.dtype, device=x.device)
    comm.reduce_scatter(out, xm)
    return out.movedim(0, dim)


def _chunk_dim(x: torch.Tensor, comm, dim: int) -> torch.Tensor:
    _check_divisible(x.shape[dim], comm, f"split along dim {dim}")
    n = x.shape[dim] // comm.size
    return x.narrow(dim, comm.rank * n, n).contiguous()


def _all_to_all_dim(x: torch.Tensor, comm, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk ``x`` along ``scatter_dim``, send chunk j to rank j, concatenate what arrives along
    ``gather_dim`` (in rank order)."""
    P = comm.size
    _check_divisible(x.shape[scatter_dim], comm, f"all_to_all scatter dim {scatter_dim}")
    send = torch.stack(x.chunk(P, dim=scatter_dim), 0).contiguous()  # (P, *chunk)
    recv = torch.empty_like(send)
    comm.all_to_all(recv, send)
    gd = gather_dim % x.dim()
    return torch.cat(recv.unbind(0), dim=gd)


# ---- autograd functions -------------------------------------------------------------------------
class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return all_reduce_tensor(g, ctx.comm), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        return all_reduce_tensor(x, comm)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScatterToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim):
        ctx.comm, ctx.dim = comm, dim
        return _chunk_dim(x, comm, dim)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim(g, ctx.comm, ctx.dim), None, None


class _GatherFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim):
        ctx.comm, ctx.dim = comm, dim
        return _all_gather_dim(x, comm, dim)

    @staticmethod
    def backward(ctx, g):
        return _chunk_dim(g, ctx.comm, ctx.dim), None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim):
        ctx.comm, ctx.dim = comm, dim
        return _all_gather_dim(x, comm, dim)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_dim(g, ctx.comm, ctx.dim), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, dim):
        ctx.comm, ctx.dim = comm, dim
        return _reduce_scatter_dim(x, comm, dim)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_dim(g, ctx.comm, ctx.dim), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, scatter_dim, gather_dim):
        ctx.comm, ctx.sd, ctx.gd = comm, scatter_dim, gather_dim
        return _all_to_all_dim(x, comm, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, g):
        return _all_to_all_dim(g, ctx.comm, ctx.gd, ctx.sd), None, None, None


# ---- public wrappers (identity on a group of one) ------------------------------------------------
def copy_to_group(x: torch.Tensor, comm) -> torch.Tensor:
    """Identity forward; backward all-reduces the gradient over ``comm`` (Megatron's *f*)."""
    return x if _size(comm) == 1 else _CopyToGroup.apply(x, comm)


def reduce_from_group(x: torch.Tensor, comm) -> torch.Tensor:
    """All-reduce (sum) forward; identity backward (Megatron's *g*)."""
    return x if _size(comm) == 1 else _ReduceFromGroup.apply(x, comm)


def scatter_to_group(x: torch.Tensor, comm, dim: int = -1) -> torch.Tensor:
    """Keep this rank's chunk of a replicated ``x`` along ``dim``; backward all-gathers."""
    return x if _size(comm) == 1 else _ScatterToGroup.apply(x, comm, dim)


def gather_from_group(x: torch.Tensor, comm, dim: int = -1) -> torch.Tensor:
    """All-gather chunks along ``dim`` into a replicated tensor; backward keeps this rank's chunk."""
    return x if _size(comm) == 1 else _GatherFromGroup.apply(x, comm, dim)


def all_gather(x: torch.Tensor, comm, dim: int = 0) -> torch.Tensor:
    """All-gather along ``dim``; backward reduce-scatters (sums) the gradient along ``dim``."""
    return x if _size(comm) == 1 else _AllGather.apply(x, comm, dim)


def reduce_scatter(x: torch.Tensor, comm, dim: int = 0) -> torch.Tensor:
    """Reduce-scatter (sum) along ``dim``; backward all-gathers the gradient."""
    return x if _size(comm) == 1 else _ReduceScatter.apply(x, comm, dim)


def all_to_all(x: torch.Tensor, comm, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk along ``scatter_dim`` to the ranks, concatenate what arrives along ``gather_dim``;
    backward is the inverse all-to-all (the two dims swapped)."""
    return x if _size(comm) == 1 else _AllToAll.apply(x, comm, scatter_dim, gather_dim)
