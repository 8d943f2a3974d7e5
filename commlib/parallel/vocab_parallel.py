"""Vocabulary parallelism (part of the tensor-parallel layers, re-exported by
:mod:`commlib.parallel.tensor`): the embedding table and the cross entropy split by vocabulary over
the group ``tp``, so the full logits never exist on one rank."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from commlib.parallel._autograd import all_reduce_tensor, reduce_from_group, reduce_scatter
from commlib.parallel._tp_common import _param, _rank_size, _seeded, _shard

__all__ = ["VocabParallelEmbedding", "vocab_parallel_cross_entropy"]


# ------------------------------------------------------------------------------------------------
class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` with the vocabulary (rows) split in contiguous ranges over ``tp``.

    Each rank looks up the ids in its range (zeros elsewhere); the partial embeddings are
    all-reduced (reduce-scattered along ``seq_dim`` with ``sequence_parallel=True``).
    ``seed``: equals the slice of ``nn.Embedding(num_embeddings, embedding_dim)`` built after
    ``torch.manual_seed(seed)``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, tp=None, sequence_parallel: bool = False,
                 seq_dim: int = 1, seed: int = 0, dtype: Optional[torch.dtype] = None, _init: bool = True):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.tp = num_embeddings, embedding_dim, tp
        self.sequence_parallel, self.seq_dim = sequence_parallel, seq_dim
        self.start, self.local_vocab = _shard(num_embeddings, tp, "num_embeddings")
        if _init:
            full = _seeded(seed, lambda: nn.Embedding(num_embeddings, embedding_dim, dtype=dtype))
            self._load_full(full.weight)

    def _load_full(self, weight):
        self.weight = _param(weight[self.start:self.start + self.local_vocab])

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, tp, **kwargs) -> "VocabParallelEmbedding":
        """Shard an existing ``nn.Embedding``."""
        m = cls(emb.num_embeddings, emb.embedding_dim, tp, _init=False, **kwargs)
        m._load_full(emb.weight)
        return m

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if _rank_size(self.tp)[1] == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.start) | (ids >= self.start + self.local_vocab)
        local = (ids - self.start).masked_fill(outside, 0)
        e = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter(e, self.tp, self.seq_dim)
        return reduce_from_group(e, self.tp)


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, tp, ignore_index):
        r, p = _rank_size(tp)
        cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
        lf = logits.to(cdt)
        V = lf.shape[-1]
        start = r * V
        m = lf.max(-1).values
        if p > 1:
            m = all_reduce_tensor(m, tp, op="max")
        shifted = lf - m.unsqueeze(-1)
        e = shifted.exp()
        outside = (target < start) | (target >= start + V)
        idx = (target - start).masked_fill(outside, 0)
        tl = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        both = torch.stack([e.sum(-1), tl])
        if p > 1:
            both = all_reduce_tensor(both, tp)
        sumexp, tl = both[0], both[1]
        loss = sumexp.log() - tl
        ignored = target == ignore_index
        loss = loss.masked_fill(ignored, 0.0)
        e.div_(sumexp.unsqueeze(-1))  # softmax of this rank's slice
        ctx.save_for_backward(e, idx, outside | ignored, ignored)
        ctx.in_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, g):
        sm, idx, no_target, ignored = ctx.saved_tensors
        grad = sm.clone()
        sub = (~no_target).to(grad.dtype)
        grad.scatter_add_(-1, idx.unsqueeze(-1), -sub.unsqueeze(-1))
        grad.masked_fill_(ignored.unsqueeze(-1), 0.0)
        grad.mul_(g.to(grad.dtype).unsqueeze(-1))
        return grad.to(ctx.in_dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp=None,
                                 reduction: str = "mean", ignore_index: int = -100) -> torch.Tensor:
    """Cross-entropy of logits split over the vocabulary (last dim) across ``tp``.

    ``logits`` (..., vocab/P) is this rank's slice (rank r holds classes [r*V/P, (r+1)*V/P), as
    produced by a :class:`ColumnParallelLinear` head without ``gather_output``); ``target`` (...)
    holds global class ids. Two all-reduces (max, then sum-exp and target logit together); the
    loss is computed in float32 (float64 for float64 logits). ``reduction``: ``"mean"`` (over
    non-ignored targets), ``"sum"`` or ``"none"``; same values as ``F.cross_entropy`` on the
    gathered logits.
    """
    loss = _VocabParallelCE.apply(logits, target, tp, ignore_index)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / (target != ignore_index).sum().clamp(min=1)
    raise ValueError(f"reduction: expected 'mean', 'sum' or 'none', got {reduction!r}")
