"""Quantized all-gather and reduce-scatter for torch's FSDP2 (``fully_shard``) on commlib groups.

    from torch.distributed.fsdp import fully_shard
    import commlib.torch.fsdp_hooks as fsdp_hooks
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)                    # a mesh over a "commlib" process group
    fully_shard(model, mesh=mesh)
    fsdp_hooks.compress_fsdp(model, all_gather="int8", reduce_scatter="int8")

FSDP2 (torch 2.13) lets each ``FSDPModule`` replace its collectives:
``set_custom_all_gather(AllGather)`` and ``set_custom_reduce_scatter(ReduceScatter)``
(``torch.distributed.fsdp._fully_shard._fsdp_api``). :class:`CompressedAllGather` and
:class:`CompressedReduceScatter` are such objects: they run the group's commlib communicator's
``all_gather`` / ``reduce_scatter`` with ``compress=`` (docs/compression.md), so the flat buffers
FSDP2 gathers and reduces travel encoded, and every rank still ends with the same bits.

What each one changes in training:

* **all-gather (parameters)**: every rank's forward and backward use the decoded parameters
  Q(w) (the gathered copy, the same on every rank); the optimizer keeps updating the
  full-precision shards, so rounding never accumulates in the weights (ZeRO++'s quantized
  weights, qwZ, do the same).
* **reduce-scatter (gradients)**: each rank's gradient buffer is encoded on its way; with
  ``error_feedback`` (EF-SGD, as :mod:`commlib.torch.hooks`) the rank first adds what its last
  encoding lost and projects the buffer itself, keeping the new residual (one per FSDP module,
  whose buffer has the same layout every step).

CPU or CUDA buffers of float32, float16 or bfloat16 (CUDA ones through the stream engine's
compressed collectives and the device's error feedback, on the current stream: docs/compression.md
"On device buffers"; FSDP2's flat buffers are the parameters' dtype or
``MixedPrecisionPolicy``'s; mixed dtypes in one module make FSDP2 gather bytes, which the codecs
refuse naming ``compress``).
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from commlib.core import codecs
from commlib.core.codecs import error_feedback_round

__all__ = ["CompressedAllGather", "CompressedReduceScatter", "compress_fsdp"]

_CODED = (torch.float32, torch.float16, torch.bfloat16)
# The reductions a compressed reduce_scatter takes (FSDP2 passes AVG, SUM or PREMUL_SUM(1/f)).
_OPS = ("sum", "avg", "premul_sum")


def _codec(compress, what: str):
    codec = codecs.get(compress)
    if codec is None:
        raise ValueError(f"compress: a codec is needed for the {what} (None is FSDP2's default one)")
    return codec


def _group(group):
    # The Python backend behind the group (commlib.torch.python_group), whose _run / _issue wrap the
    # communicator's calls in the backend's Work (completed on its completion thread).
    from commlib.torch import python_group
    try:
        return python_group(group)
    except TypeError:
        raise TypeError(f"group: FSDP2's compressed collectives run on commlib groups, not "
                        f"{type(group).__name__}") from None


def _check(t: torch.Tensor, name: str, codec) -> None:
    if t.device.type not in ("cpu", "cuda") or t.dtype not in _CODED:
        raise ValueError(f"compress: {codec.name} codes CPU or CUDA float32, float16 or bfloat16 buffers; {name} "
                         f"holds {t.dtype} on {t.device} (FSDP2 gathers bytes when a module's parameters "
                         "mix dtypes)")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")


def _issue(pg, result: torch.Tensor, async_op: bool, call_fn):
    """Runs ``call_fn(async_op)`` (a commlib call) as the backend's Work; None once done when
    blocking (as ``dist.all_gather_single`` answers)."""
    work = pg._run(bool(async_op), [result], lambda call, a: pg._issue(call, a, call_fn(a)))
    if async_op:
        return work
    work.wait()
    return None


class _Alloc:
    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A plain buffer for FSDP2's flat all-gather / reduce-scatter tensors."""
        return torch.empty(size, dtype=dtype, device=device)


class CompressedAllGather(_Alloc, AllGather):
    """FSDP2's parameter all-gather with commlib's compressed ``all_gather`` (``compress``: a
    codec name or ``commlib.codecs.Codec``). ``calls`` counts its calls."""

    def __init__(self, compress="int8"):
        self.codec = _codec(compress, "all-gather")
        self.calls = 0

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False):
        _check(input_tensor, "input_tensor", self.codec)
        _check(output_tensor, "output_tensor", self.codec)
        pg = _group(group)
        self.calls += 1
        out, inp = output_tensor.view(-1), input_tensor.view(-1)
        return _issue(pg, output_tensor, async_op,
                      lambda a: pg.comm.all_gather(out, inp, compress=self.codec, async_op=a))


class CompressedReduceScatter(_Alloc, ReduceScatter):
    """FSDP2's gradient reduce-scatter with commlib's compressed ``reduce_scatter``; with
    ``error_feedback`` (float32 buffers), the EF-SGD residual of this module's buffer is added
    before it is encoded (``residual`` holds it between steps)."""

    def __init__(self, compress="int8", error_feedback: bool = True):
        self.codec = _codec(compress, "reduce-scatter")
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback: a bool, got {type(error_feedback).__name__}")
        self.error_feedback = error_feedback
        self.residual: Optional[torch.Tensor] = None
        self.calls = 0

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op=dist.ReduceOp.SUM, async_op: bool = False):
        from commlib.torch.staging import op_of
        _check(input_tensor, "input_tensor", self.codec)
        _check(output_tensor, "output_tensor", self.codec)
        name, scale = op_of(op)
        if name not in _OPS:
            raise ValueError(f"op: a compressed reduce-scatter sums (SUM, AVG, PREMUL_SUM), not {name}")
        pg = _group(group)
        flat = input_tensor.view(-1)
        if self.error_feedback:
            if flat.dtype != torch.float32:
                raise ValueError(f"error_feedback: keeps float32 residuals; the buffer holds {flat.dtype} "
                                 "(CompressedReduceScatter(error_feedback=False) compresses it without)")
            old = self.residual if self.residual is not None and self.residual.shape == flat.shape else None
            self.residual = error_feedback_round(self.codec, flat, old)
        self.calls += 1
        out = output_tensor.view(-1)
        return _issue(pg, output_tensor, async_op, lambda a: pg.comm.reduce_scatter(
            out, flat, op=name, scale=scale, compress=self.codec, async_op=a))


def compress_fsdp(module: torch.nn.Module, all_gather="int8", reduce_scatter="int8",
                  error_feedback: bool = True) -> List[torch.nn.Module]:
    """Installs the compressed collectives on every ``fully_shard``-ed module in ``module`` (itself
    included): a fresh :class:`CompressedAllGather` (``all_gather``: a codec, or None to keep
    FSDP2's) and :class:`CompressedReduceScatter` (``reduce_scatter``, ``error_feedback``) per
    module, so each keeps its own residual. Returns the modules changed; raises ValueError naming
    ``module`` if none is an FSDP module."""
    from torch.distributed.fsdp import FSDPModule
    if all_gather is not None:
        _codec(all_gather, "all-gather")
    if reduce_scatter is not None:
        _codec(reduce_scatter, "reduce-scatter")
    changed = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not changed:
        raise ValueError("module: holds no fully_shard-ed module (call fully_shard first)")
    for m in changed:
        if all_gather is not None:
            m.set_custom_all_gather(CompressedAllGather(all_gather))
        if reduce_scatter is not None:
            m.set_custom_reduce_scatter(CompressedReduceScatter(reduce_scatter, error_feedback))
    return changed
