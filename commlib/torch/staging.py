"""Staging torch tensors for the commlib core.

The core moves contiguous 1-D buffers of the dtypes it knows (``NATIVE``). Everything else is staged
here: non-contiguous tensors through contiguous copies (copied back by a finalizer), other dtypes as
bytes (data movement) or in a wider dtype (reductions), sparse tensors by gathering their indices
and values.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from commlib.device import dtypes

RedOpType = dist.ReduceOp.RedOpType

_OPS = {
    RedOpType.SUM: "sum",
    RedOpType.AVG: "avg",
    RedOpType.PRODUCT: "prod",
    RedOpType.MIN: "min",
    RedOpType.MAX: "max",
    RedOpType.BAND: "band",
    RedOpType.BOR: "bor",
    RedOpType.BXOR: "bxor",
    RedOpType.PREMUL_SUM: "premul_sum",
}

NATIVE = frozenset(dtypes.torch_dtypes(torch))



def as_flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D tensor sharing t's memory when possible (a copy otherwise)."""
    t = t.detach()
    if t.is_contiguous():
        return t.view(-1)
    return t.contiguous().view(-1)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Contiguous 1-D buffer of t's bytes (for data movement of dtypes the core does not know)."""
    flat = as_flat(t)
    return flat if flat.dtype in NATIVE else flat.view(torch.uint8)


class Staged:
    """Output staging: ``buf`` is what the core writes; ``done()`` copies it back into ``t``."""

    __slots__ = ("t", "buf", "copy")

    def __init__(self, t: torch.Tensor, buf: torch.Tensor, copy: bool):
        self.t, self.buf, self.copy = t, buf, copy

    def done(self):
        if self.copy:
            with torch.no_grad():
                self.t.copy_(self.buf.view(self.t.shape) if self.buf.dtype == self.t.dtype
                             else self.buf.view(self.t.dtype).view(self.t.shape))


def out_bytes(t: torch.Tensor) -> "Staged":
    """Stage an output for data movement (same element type or bytes)."""
    if t.is_contiguous():
        flat = t.detach().view(-1)
        return Staged(t, flat if flat.dtype in NATIVE else flat.view(torch.uint8), False)
    buf = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
    return Staged(t, buf if t.dtype in NATIVE else buf.view(torch.uint8), True)


def reduction_staging(t: torch.Tensor, op: str):
    """(buffer, op, finalize) for reducing t in place with ``op``.

    Native dtypes reduce directly (through a contiguous copy if needed); bool reduces as uint8
    (sum/max/bor -> max, prod/min/band -> min); complex as pairs of reals (sum, avg, premul_sum);
    other integer dtypes in int64 and other floats in float32, cast back afterwards.
    The finalizers copy into ``t`` and run under ``torch.no_grad()``.
    """
    t_out, t = t, t.detach()
    dt = t.dtype
    if dt in NATIVE:
        if t.is_contiguous():
            return t.view(-1), op, None
        buf = t.contiguous().view(-1)
        return buf, op, lambda: t_out.copy_(buf.view(t.shape))
    if dt == torch.bool:
        mapped = {"sum": "max", "max": "max", "bor": "max", "avg": "max", "prod": "min",
                  "min": "min", "band": "min", "bxor": "bxor"}.get(op)
        if mapped is None:
            raise ValueError(f"op: {op} is not defined for torch.bool tensors")
        buf = t.contiguous().view(-1).view(torch.uint8)
        if t.is_contiguous():
            return buf, mapped, None
        return buf, mapped, lambda: t_out.copy_(buf.view(torch.bool).view(t.shape))
    if dt.is_complex:
        if op not in ("sum", "avg", "premul_sum"):
            raise ValueError(f"op: {op} is not defined for complex tensors")
        src = t if t.is_contiguous() else t.contiguous()
        buf = torch.view_as_real(src).view(-1)
        if t.is_contiguous():
            return buf, op, None
        return buf, op, lambda: t_out.copy_(src)
    wide = torch.float32 if dt.is_floating_point else torch.int64
    if wide == torch.int64 and op in ("avg", "premul_sum"):
        wide = torch.float64
    buf = t.to(wide).contiguous().view(-1)
    return buf, op, lambda: t_out.copy_(buf.view(t.shape))


_DTYPE_NAMES = dtypes.torch_dtypes(torch)  # {torch.dtype: name}, from the one dtype table


def check_reduction(t: torch.Tensor, op: str) -> None:
    """What reduction_staging and then the communicator (call_checks.check_op) refuse of ``op`` on
    ``t``, without staging it: a call of several tensors checks every one before any is sent."""
    dt = t.dtype
    if dt == torch.bool and op == "premul_sum":
        raise ValueError(f"op: {op} is not defined for torch.bool tensors")
    if dt.is_complex and op not in ("sum", "avg", "premul_sum"):
        raise ValueError(f"op: {op} is not defined for complex tensors")
    if op in ("band", "bor", "bxor") and (dt.is_floating_point or dt.is_complex):
        real = dt.to_real() if dt.is_complex else dt
        raise ValueError(f"op: bitwise reduction '{op}' is defined for integer dtypes only, not "
                         f"{_DTYPE_NAMES.get(real, 'float32')}")


def op_of(reduce_op):
    """(commlib op name, scale or None) from torch's ReduceOp / RedOpType."""
    kind = getattr(reduce_op, "op", reduce_op)
    name = _OPS.get(kind)
    if name is None:
        raise ValueError(f"op: unsupported ReduceOp {reduce_op!r}")
    if name != "premul_sum":
        return name, None
    factor = getattr(reduce_op, "factor", None)
    if factor is None:
        raise ValueError("op: PREMUL_SUM without a factor")
    if isinstance(factor, torch.Tensor):
        factor = factor.item()
    return name, float(factor)



def sparse_all_reduce(comm, t: torch.Tensor, op: str) -> None:
    """Sum a sparse COO tensor over the ranks, in place (as gloo does).

    Every rank's (coalesced) indices and values are all-gathered, padded to the largest count of
    non-zeros, then summed into one coalesced tensor that replaces ``t``'s contents. Blocking.
    """
    if op != "sum":
        raise ValueError(f"op: sparse tensors are reduced with SUM only, not {op}")
    if t.layout != torch.sparse_coo:
        raise TypeError(f"tensor: layout {t.layout} is not supported (sparse COO only)")
    src = t.detach().coalesce()
    idx = src.indices().contiguous()           # (sparse_dim, nnz) int64
    val = src.values().contiguous()            # (nnz, *dense_shape)
    P = comm.size
    counts = torch.empty(P, dtype=torch.int64)
    comm.all_gather(counts, torch.tensor([idx.shape[1]], dtype=torch.int64))
    m = int(counts.max())
    idx_pad = torch.zeros((idx.shape[0], m), dtype=torch.int64)
    idx_pad[:, :idx.shape[1]] = idx
    val_pad = torch.zeros((m,) + tuple(val.shape[1:]), dtype=val.dtype)
    val_pad[:val.shape[0]] = val
    all_idx = torch.empty((P,) + tuple(idx_pad.shape), dtype=torch.int64)
    comm.all_gather(all_idx.view(-1), idx_pad.view(-1))
    vbuf = as_bytes(val_pad)
    all_val = torch.empty((P,) + tuple(val_pad.shape), dtype=val.dtype)
    comm.all_gather(as_bytes(all_val), vbuf)
    pieces_i = [all_idx[r, :, :int(counts[r])] for r in range(P)]
    pieces_v = [all_val[r, :int(counts[r])] for r in range(P)]
    total = torch.sparse_coo_tensor(torch.cat(pieces_i, 1), torch.cat(pieces_v, 0), t.shape,
                                    dtype=t.dtype).coalesce()
    with torch.no_grad():
        t.copy_(total)
