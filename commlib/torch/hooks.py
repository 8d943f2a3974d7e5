"""DDP communication hooks on commlib groups: compressed all_reduce with error feedback.

    import commlib.torch, commlib.torch.hooks as hooks
    ddp = torch.nn.parallel.DistributedDataParallel(model)        # on a "commlib" process group
    ddp.register_comm_hook(hooks.ErrorFeedbackState(compress="int8"), hooks.compressed_allreduce_hook)

The hook averages each gradient bucket with commlib's compressed all_reduce (``compress=``,
docs/compression.md), asynchronously on the group's completion thread, as DDP's default hook
does with a plain all_reduce. With error feedback (EF-SGD; Seide et al.'s 1-bit SGD, Karimireddy
et al. 2019) each rank adds to its bucket the residual its last encoding lost, encodes the sum
itself (``Codec.round_trip``), keeps the new residual for the next step and sends the encoded
values, whose first encoding in the collective then changes little (the schedule's blocks may
straddle this rank's). What error feedback does not see: the re-encodings of partial sums inside
the collective (at most one per hop, shared by the ranks, each within the codec's bound).
docs/compression.md says which combinations converge and why.

PowerSGD: :func:`powersgd_hook` with :class:`PowerSGDState` (``commlib.torch.powersgd``) is
torch's algorithm on commlib's all_reduce with one issuing thread per state, so it works with any
number of buckets. torch's own ``powerSGD_hook`` (torch.distributed.algorithms.ddp_comm_hooks) runs
unchanged on a commlib group with one bucket: its callbacks issue collectives from the completion
thread, which with several buckets can reach the ranks in different orders (a MismatchError).
"""
# (no `from __future__ import annotations`: DDP checks the hook's annotations as objects)
from typing import Dict

import torch
import torch.distributed as dist

from commlib.core import codecs
from commlib.core.codecs import error_feedback_round
from commlib.torch.powersgd import PowerSGDState, powersgd_hook

__all__ = ["ErrorFeedbackState", "compressed_allreduce_hook", "PowerSGDState", "powersgd_hook"]


class ErrorFeedbackState:
    """State of :func:`compressed_allreduce_hook`: the group (default: the default group, which
    must be a commlib group), the codec (``compress``: a name or ``commlib.codecs.Codec``) and,
    with ``error_feedback``, one residual per gradient bucket (``residuals``, by bucket index)."""

    def __init__(self, process_group=None, compress="int8", error_feedback: bool = True):
        self.process_group = process_group
        self.codec = codecs.get(compress)
        if self.codec is None:
            raise ValueError("compress: a codec is needed (None would be DDP's default hook)")
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback: a bool, got {type(error_feedback).__name__}")
        self.error_feedback = error_feedback
        self.residuals: Dict[int, torch.Tensor] = {}

    def _group(self):
        # The Python backend of the group (commlib.torch.python_group: also behind the C++ one),
        # whose completion thread finishes the hook's Work.
        from commlib.torch import python_group
        try:
            return python_group(self.process_group)
        except TypeError:
            raise TypeError(f"process_group: the hook runs on commlib groups, not "
                            f"{type(self.process_group).__name__}") from None


def compressed_allreduce_hook(state: ErrorFeedbackState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged over the group with compressed all_reduce
    (after the error-feedback step when the state asks for it). CPU or CUDA float32/float16/bfloat16
    gradients (CUDA: the stream engine's compressed all_reduce and the device's error feedback, on
    the current stream); error feedback keeps float32 residuals (float32 only)."""
    grad = bucket.buffer()
    if grad.device.type not in ("cpu", "cuda") or grad.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"bucket: compressed all_reduce takes CPU or CUDA float32, float16 or bfloat16 gradients, "
                         f"not {grad.dtype} on {grad.device}")
    pg = state._group()
    if state.error_feedback and grad.dtype != torch.float32:
        raise ValueError(f"error_feedback: keeps float32 residuals; the bucket holds {grad.dtype} "
                         "(ErrorFeedbackState(error_feedback=False) compresses it without)")
    if state.error_feedback:
        i = bucket.index()
        old = state.residuals.get(i)
        state.residuals[i] = error_feedback_round(state.codec, grad, old if old is not None and
                                                  old.shape == grad.shape else None)
    comm = pg.comm
    # The backend's own completion thread finishes the Work (as for DDP's default hook).
    work = pg._run(True, [grad], lambda call, async_op: pg._issue(
        call, async_op, comm.all_reduce(grad, op="avg", compress=state.codec, async_op=async_op)))
    return work.get_future().then(lambda fut: fut.value()[0])
