"""The latency path of the torch backend: a blocking collective on plain CPU tensors.

``dist.all_reduce(t)`` (and ``broadcast``, ``reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single`` without split sizes, ``barrier``) on contiguous
CPU tensors of a dtype the core moves goes from the ProcessGroup method straight into the core's
C++ entry (``_C.fast_collective``, which reads the
tensor's pointer, size and dtype itself once this module registered torch's types) and returns a
``DoneWork``, whose future is made only if someone asks for it. Anything else (async calls, held
back point-to-point, PREMUL_SUM, other dtypes or layouts) answers False here and takes the general
path, which validates and explains.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.futures import Future

import commlib._C as _C
from commlib.core.call_spec import DTYPE
from commlib.device import dtypes
from commlib.torch.work import Work, timeout_seconds

# One registry for the C++ entry's host and device readers (csrc/bindings/buffer_view.cc): CPU
# tensors here, CUDA tensors too where torch has CUDA (their current stream is part of a device call).
_C.register_torch_types(torch.Tensor, torch.strided, {t: DTYPE[n] for t, n in dtypes.torch_dtypes(torch).items()},
                        getattr(torch._C, "_cuda_getCurrentRawStream", None))

fast_collective = _C.fast_collective
ALL_REDUCE = _C.COLLECTIVES.index("all_reduce")
BROADCAST = _C.COLLECTIVES.index("broadcast")
REDUCE = _C.COLLECTIVES.index("reduce")
ALL_GATHER = _C.COLLECTIVES.index("all_gather")
REDUCE_SCATTER = _C.COLLECTIVES.index("reduce_scatter")
ALL_TO_ALL = _C.COLLECTIVES.index("all_to_all")
BARRIER = _C.COLLECTIVES.index("barrier")

_OP_NAMES = ("sum", "avg", "prod", "min", "max", "band", "bor", "bxor")
_RED = dist.ReduceOp.RedOpType


def _op_table():
    """``hash(opts.reduceOp)`` -> commlib op name. torch's ReduceOp hashes to its RedOpType value
    (1.5 us cheaper than ``.op``); checked here, and the fast path is off if that ever changes.
    PREMUL_SUM is absent: ``OP_BY_HASH.get`` gives None, which ``fast_collective`` declines."""
    kinds = (_RED.SUM, _RED.AVG, _RED.PRODUCT, _RED.MIN, _RED.MAX, _RED.BAND, _RED.BOR, _RED.BXOR)
    try:
        codes = [hash(dist.ReduceOp(k)) for k in kinds]
    except Exception:  # noqa: BLE001 - no fast path then
        return {}
    if codes != [int(k) for k in kinds] or len(set(codes)) != len(codes):
        return {}
    return dict(zip(codes, _OP_NAMES))


OP_BY_HASH = _op_table()


class DoneWork(Work):
    """The Work of a call that already completed on the caller's thread (value: ``result``).

    Cheap to make (no Future until ``get_future()``), since the blocking path makes one per call.
    """

    def __init__(self, result):
        dist.Work.__init__(self)
        self._result = result
        self._done_fut = None

    @property
    def _fut(self):
        if self._done_fut is None:
            fut = Future()
            fut.set_result(self._result)
            self._done_fut = fut
        return self._done_fut

    def wait(self, timeout=None):
        timeout_seconds(timeout)  # checked like every timeout, though nothing is left to wait for
        return True

    def get_future(self):
        return self._fut  # completed with its value: never carries an error

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result


class DoneWorks:
    """Hands out DoneWorks, reusing the last one when nobody else holds it (a blocking
    ``dist.all_reduce`` drops its work at once): constructing torch's Work costs ~1 us."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last = None

    def get(self, result) -> DoneWork:
        w = self._last
        # references: self._last and getrefcount's argument; any other means someone kept it
        if w is not None and sys.getrefcount(w) == 3:
            w._result = result
            w._done_fut = None
            return w
        w = self._last = DoneWork(result)
        return w
