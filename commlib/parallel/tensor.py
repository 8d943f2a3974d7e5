"""Tensor parallelism (Megatron-style) on commlib communicators.

Every layer takes its tensor-parallel group ``tp`` explicitly (a commlib communicator, usually from
``comm.split``); there is no module-level state. ``tp=None`` (or a group of one) gives the plain,
unsharded layer, which is also how the reference model in the tests is built.

Layers (activations are ``(batch, seq, features)``; ``seq_dim`` says where the sequence is):

* :class:`ColumnParallelLinear`: weight split by output features. The input is replicated; the
  output is this rank's slice of the features, or the whole output with ``gather_output=True``.
* :class:`RowParallelLinear`: weight split by input features. ``input_is_parallel=True`` takes the
  split output of a column-parallel layer, ``False`` splits a replicated input; partial sums are
  all-reduced (reduce-scattered over the sequence in sequence-parallel mode).
* :class:`FeatureParallelLinear`: input and output both split by features; the per-layer choice
  between *gather* (all-gather the input, compute this rank's output features) and *scatter*
  (multiply this rank's input features, reduce-scatter the partial outputs).
* :class:`VocabParallelEmbedding` and :func:`vocab_parallel_cross_entropy`: vocabulary split over
  the ranks; the full logits never exist on one rank.
* :class:`ParallelAttention`: heads split over the ranks (q/k/v column-parallel, output projection
  row-parallel), with an optional context-parallel group for ring / Ulysses / hybrid attention.
* :class:`SequenceParallelLayerNorm`: a LayerNorm for sequence-parallel mode whose weight and bias
  gradients are all-reduced over ``tp`` (each rank only sees its slice of the sequence, so without
  the all-reduce the replicas silently drift apart).

Initialisation: a layer built with ``seed=s`` holds exactly the slice of the unsharded
``torch.nn.Linear`` / ``torch.nn.Embedding`` / ``torch.nn.MultiheadAttention`` that
``torch.manual_seed(s)`` followed by the torch constructor would create, whatever the group size
(the global RNG state is left untouched). ``from_linear`` / ``from_mha`` shard an existing module.

Sequence-parallel mode (``sequence_parallel=True``): activations between the tensor-parallel
regions are split along the sequence over ``tp``: a column-parallel layer all-gathers its input
over the sequence (backward: reduce-scatter), a row-parallel layer reduce-scatters its output over
the sequence (backward: all-gather). Parameters applied to sequence-split activations (LayerNorm,
the row-parallel bias) get their gradients all-reduced over ``tp`` automatically.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from commlib.parallel._autograd import (all_gather, copy_to_group,
                                        gather_from_group, reduce_from_group, reduce_scatter,
                                        scatter_to_group)
from commlib.parallel._tp_common import _param, _rank_size, _seeded, _shard
from commlib.parallel.vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy  # noqa: F401 (re-exported)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "FeatureParallelLinear", "choose_strategy",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "ParallelAttention",
           "SequenceParallelLayerNorm"]


# ------------------------------------------------------------------------------------------------
class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` (out_features, in_features) split by rows (output features).

    Args:
        in_features, out_features: sizes of the unsharded layer; ``out_features`` must divide by
            the group size.
        tp: tensor-parallel communicator (``None``: unsharded).
        bias: add a (split) bias.
        gather_output: all-gather the output features so every rank returns the full ``y``
            (backward keeps each rank's slice of the gradient). Otherwise the rank's slice of ``y``.
        sequence_parallel: the input is split along ``seq_dim`` over ``tp``; it is all-gathered
            first (backward: reduce-scatter).
        seed: the weight equals that of ``nn.Linear(in, out)`` built after ``torch.manual_seed(seed)``.
    """

    def __init__(self, in_features: int, out_features: int, tp=None, bias: bool = True,
                 gather_output: bool = False, sequence_parallel: bool = False, seq_dim: int = 1,
                 seed: int = 0, dtype: Optional[torch.dtype] = None, _init: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.tp = in_features, out_features, tp
        self.gather_output, self.sequence_parallel, self.seq_dim = gather_output, sequence_parallel, seq_dim
        self.start, self.local_out = _shard(out_features, tp, "out_features")
        if _init:
            full = _seeded(seed, lambda: nn.Linear(in_features, out_features, bias=bias, dtype=dtype))
            self._load_full(full.weight, full.bias)
        else:
            self.weight = nn.Parameter(torch.empty(self.local_out, in_features, dtype=dtype))
            self.bias = nn.Parameter(torch.empty(self.local_out, dtype=dtype)) if bias else None

    def _load_full(self, weight, bias):
        s, n = self.start, self.local_out
        self.weight = _param(weight[s:s + n])
        self.bias = _param(bias[s:s + n]) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, tp, **kwargs) -> "ColumnParallelLinear":
        """Shard an existing ``nn.Linear`` (this rank keeps its rows of the weight and bias)."""
        m = cls(linear.in_features, linear.out_features, tp, bias=linear.bias is not None,
                dtype=linear.weight.dtype, _init=False, **kwargs)
        m._load_full(linear.weight, linear.bias)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            x = all_gather(x, self.tp, self.seq_dim)
        else:
            x = copy_to_group(x, self.tp)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = gather_from_group(y, self.tp, -1)
        return y

    def extra_repr(self):
        return (f"in={self.in_features}, out={self.out_features} (local {self.local_out}), "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` (out_features, in_features) split by columns (input features).

    Args:
        input_is_parallel: ``x`` is already this rank's slice of the input features (the output
            of a :class:`ColumnParallelLinear` without ``gather_output``); ``False``: ``x`` is the
            full, replicated input and is split here (backward: all-gather).
        sequence_parallel: reduce-scatter the partial sums along ``seq_dim`` instead of
            all-reducing them (the output is split along the sequence); the bias gradient is then
            all-reduced over ``tp``.
        seed: the weight equals that of ``nn.Linear(in, out)`` built after ``torch.manual_seed(seed)``.

    The bias is replicated and added once, after the reduction.
    """

    def __init__(self, in_features: int, out_features: int, tp=None, bias: bool = True,
                 input_is_parallel: bool = True, sequence_parallel: bool = False, seq_dim: int = 1,
                 seed: int = 0, dtype: Optional[torch.dtype] = None, _init: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.tp = in_features, out_features, tp
        self.input_is_parallel, self.sequence_parallel, self.seq_dim = input_is_parallel, sequence_parallel, seq_dim
        self.start, self.local_in = _shard(in_features, tp, "in_features")
        if _init:
            full = _seeded(seed, lambda: nn.Linear(in_features, out_features, bias=bias, dtype=dtype))
            self._load_full(full.weight, full.bias)
        else:
            self.weight = nn.Parameter(torch.empty(out_features, self.local_in, dtype=dtype))
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

    def _load_full(self, weight, bias):
        s, n = self.start, self.local_in
        self.weight = _param(weight[:, s:s + n])
        self.bias = _param(bias) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, tp, **kwargs) -> "RowParallelLinear":
        """Shard an existing ``nn.Linear`` (this rank keeps its columns; the bias is replicated)."""
        m = cls(linear.in_features, linear.out_features, tp, bias=linear.bias is not None,
                dtype=linear.weight.dtype, _init=False, **kwargs)
        m._load_full(linear.weight, linear.bias)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_group(x, self.tp, -1)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter(y, self.tp, self.seq_dim)
        else:
            y = reduce_from_group(y, self.tp)
        if self.bias is not None:
            b = copy_to_group(self.bias, self.tp) if self.sequence_parallel else self.bias
            y = y + b
        return y

    def extra_repr(self):
        return (f"in={self.in_features} (local {self.local_in}), out={self.out_features}, "
                f"input_is_parallel={self.input_is_parallel}, sequence_parallel={self.sequence_parallel}")


# ------------------------------------------------------------------------------------------------
def choose_strategy(in_features: int, out_features: int) -> str:
    """The per-layer rule for a linear layer whose input and output are both split by features.

    *gather*: all-gather the input features, every rank computes its slice of the output features
    (moves ``in_features`` per token); *scatter*: every rank multiplies its slice of the input
    features by its columns of the weight and the partial outputs are reduce-scattered (moves
    ``out_features`` per token). Ring all-gather and ring reduce-scatter cost the same per element,
    so the rule picks the side with fewer features: ``"gather"`` when the input is the narrow side,
    ``"scatter"`` when the output is (ties: gather, which has no reduction arithmetic).
    """
    return "gather" if in_features <= out_features else "scatter"


class FeatureParallelLinear(nn.Module):
    """A linear layer whose input and output are both split by features over ``tp``.

    ``strategy`` is ``"gather"``, ``"scatter"`` or ``"auto"`` (:func:`choose_strategy`). Both give
    the same result (up to rounding) from the same weights: rank r receives ``x[..., slice_r(in)]``
    and returns ``y[..., slice_r(out)]``. ``seed`` as for :class:`ColumnParallelLinear`.
    """

    def __init__(self, in_features: int, out_features: int, tp=None, bias: bool = True,
                 strategy: str = "auto", seed: int = 0, dtype: Optional[torch.dtype] = None,
                 _init: bool = True):
        super().__init__()
        if strategy == "auto":
            strategy = choose_strategy(in_features, out_features)
        if strategy not in ("gather", "scatter"):
            raise ValueError(f"strategy: expected 'gather', 'scatter' or 'auto', got {strategy!r}")
        self.in_features, self.out_features, self.tp, self.strategy = in_features, out_features, tp, strategy
        self.in_start, self.local_in = _shard(in_features, tp, "in_features")
        self.out_start, self.local_out = _shard(out_features, tp, "out_features")
        if _init:
            full = _seeded(seed, lambda: nn.Linear(in_features, out_features, bias=bias, dtype=dtype))
            self._load_full(full.weight, full.bias)

    def _load_full(self, weight, bias):
        o, no, i, ni = self.out_start, self.local_out, self.in_start, self.local_in
        self.weight = _param(weight[o:o + no] if self.strategy == "gather" else weight[:, i:i + ni])
        self.bias = _param(bias[o:o + no]) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, tp, strategy: str = "auto") -> "FeatureParallelLinear":
        m = cls(linear.in_features, linear.out_features, tp, bias=linear.bias is not None,
                strategy=strategy, _init=False)
        m._load_full(linear.weight, linear.bias)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.strategy == "gather":
            y = F.linear(all_gather(x, self.tp, x.dim() - 1), self.weight)
        else:
            y = reduce_scatter(F.linear(x, self.weight), self.tp, x.dim() - 1)
        return y + self.bias if self.bias is not None else y


# ------------------------------------------------------------------------------------------------
class SequenceParallelLayerNorm(nn.LayerNorm):
    """LayerNorm for sequence-parallel regions: the input is split along the sequence over ``tp``,
    the weight and bias are replicated, and their gradients are all-reduced (summed) over ``tp``
    in the backward pass, so every replica gets the gradient of the whole sequence.

    With ``tp=None`` (or ``sequence_parallel=False``) it is a plain ``nn.LayerNorm``.
    """

    def __init__(self, normalized_shape, tp=None, sequence_parallel: bool = True, eps: float = 1e-5,
                 dtype: Optional[torch.dtype] = None):
        super().__init__(normalized_shape, eps=eps, dtype=dtype)
        self.tp, self.sequence_parallel = tp, sequence_parallel

    def forward(self, x):
        if not self.sequence_parallel:
            return super().forward(x)
        w = copy_to_group(self.weight, self.tp)
        b = copy_to_group(self.bias, self.tp)
        return F.layer_norm(x, self.normalized_shape, w, b, self.eps)


# ------------------------------------------------------------------------------------------------
class ParallelAttention(nn.Module):
    """Multi-head self-attention with the heads split over ``tp``.

    Equivalent to ``nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)`` (self-attention,
    optional causal mask): q/k/v projections are column-parallel by heads (no communication), each
    rank attends over its ``num_heads / P`` heads, and the output projection is row-parallel (one
    all-reduce, or a reduce-scatter over the sequence in sequence-parallel mode).

    Context parallelism: with ``cp`` given, the input is this rank's part of the sequence and the
    attention runs across ``cp`` with ``cp_mode`` ``"ring"`` (:func:`ring_attention`, ``layout``
    "contiguous" or "zigzag"), ``"ulysses"`` (:func:`ulysses_attention`) or ``"hybrid"``
    (:func:`hybrid_attention`, ``cp`` is then the pair ``(ulysses_group, ring_group)``).

    ``seed``: the weights are the slices of ``nn.MultiheadAttention`` built after
    ``torch.manual_seed(seed)``; :meth:`from_mha` shards an existing module.
    """

    def __init__(self, embed_dim: int, num_heads: int, tp=None, bias: bool = True, causal: bool = True,
                 sequence_parallel: bool = False, cp=None, cp_mode: str = "ring",
                 layout: str = "contiguous", seed: int = 0, dtype: Optional[torch.dtype] = None,
                 _init: bool = True):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim: {embed_dim} is not a multiple of num_heads ({num_heads})")
        r, p = _rank_size(tp)
        if num_heads % p:
            raise ValueError(f"num_heads: {num_heads} heads do not divide over the tensor-parallel "
                             f"group of {p} ranks")
        if cp_mode not in ("ring", "ulysses", "hybrid"):
            raise ValueError(f"cp_mode: expected 'ring', 'ulysses' or 'hybrid', got {cp_mode!r}")
        self.embed_dim, self.num_heads, self.tp, self.causal = embed_dim, num_heads, tp, causal
        self.head_dim = embed_dim // num_heads
        self.local_heads = num_heads // p
        self.sequence_parallel, self.cp, self.cp_mode, self.layout = sequence_parallel, cp, cp_mode, layout
        self.bias = bias
        self.qkv = ColumnParallelLinear(embed_dim, 3 * self.local_heads * self.head_dim * p, tp, bias=bias,
                                        sequence_parallel=sequence_parallel, _init=False, dtype=dtype)
        self.proj = RowParallelLinear(embed_dim, embed_dim, tp, bias=bias, input_is_parallel=True,
                                      sequence_parallel=sequence_parallel, _init=False, dtype=dtype)
        if _init:
            full = _seeded(seed, lambda: nn.MultiheadAttention(embed_dim, num_heads, bias=bias,
                                                               batch_first=True, dtype=dtype))
            self._load_mha(full)

    def _load_mha(self, mha: nn.MultiheadAttention):
        d = self.embed_dim
        r, _ = _rank_size(self.tp)
        n = self.local_heads * self.head_dim
        s = r * n
        w = mha.in_proj_weight
        self.qkv.weight = _param(torch.cat([w[i * d + s:i * d + s + n] for i in range(3)]))
        if self.bias:
            b = mha.in_proj_bias
            self.qkv.bias = _param(torch.cat([b[i * d + s:i * d + s + n] for i in range(3)]))
            self.proj.bias = _param(mha.out_proj.bias)
        self.proj.weight = _param(mha.out_proj.weight[:, s:s + n])

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention, tp, **kwargs) -> "ParallelAttention":
        """Shard an existing ``nn.MultiheadAttention`` (self-attention, batch_first layout)."""
        m = cls(mha.embed_dim, mha.num_heads, tp, bias=mha.in_proj_bias is not None, _init=False,
                dtype=mha.in_proj_weight.dtype, **kwargs)
        m._load_mha(mha)
        return m

    def attend(self, q, k, v):
        """The attention core on (batch, local_heads, seq, head_dim) tensors."""
        if self.cp is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        from commlib.parallel import sequence
        if self.cp_mode == "ring":
            return sequence.ring_attention(q, k, v, self.cp, causal=self.causal, layout=self.layout)
        if self.cp_mode == "ulysses":
            return sequence.ulysses_attention(q, k, v, self.cp, causal=self.causal, layout=self.layout)
        ug, rg = self.cp
        return sequence.hybrid_attention(q, k, v, ug, rg, causal=self.causal, layout=self.layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (B, S, 3 * local_heads * head_dim)
        B, S = qkv.shape[0], qkv.shape[1]
        qkv = qkv.view(B, S, 3, self.local_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, h, S, D), non-contiguous
        o = self.attend(q, k, v)
        o = o.transpose(1, 2).reshape(B, S, self.local_heads * self.head_dim)
        return self.proj(o)
