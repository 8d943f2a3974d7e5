"""Error feedback for compressed gradient averaging (EF-SGD; Seide et al.'s 1-bit SGD, Karimireddy
et al. 2019), shared by DataParallel(compress=, error_feedback=True) and the DDP hook
(commlib.torch.hooks): each rank adds to its gradient the residual its last encoding lost,
encodes the sum itself and keeps what this encoding loses for the next step. docs/compression.md
says which combinations converge and why."""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["error_feedback_round"]


def error_feedback_round(codec, grad: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
    """One error-feedback step on a flat CPU float32 tensor, in place: ``grad += residual`` (if
    any), then ``grad = Q(grad)`` (``codec``'s projection, a ``commlib.codecs.Codec``); returns the
    new residual (what Q dropped)."""
    if residual is not None:
        grad.add_(residual)
    q = torch.from_numpy(codec.round_trip(grad.detach().numpy()))
    new_residual = grad - q
    grad.copy_(q)
    return new_residual
