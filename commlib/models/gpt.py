"""A tiny GPT whose attention and MLP run tensor-parallel and/or sequence-parallel on commlib groups.

Used by the tests (sharded training must match single-process training), by
``bench/parallel_step.py`` (through :mod:`commlib.models.gpt_timing`) and by the pipeline examples
(:func:`split_layers` and :class:`GPTStage` cut it into pipeline stages). The ranks are laid out as ``rank = cp_rank * tp_size + tp_rank``
(tensor parallelism innermost, as it needs the fastest links); :func:`make_groups` builds the
groups with ``comm.split``.

* tensor parallelism over ``tp``: vocabulary-parallel embedding and LM head with vocab-parallel
  cross-entropy, heads split in attention, column/row-parallel MLP; optionally sequence-parallel
  (activations split along the sequence over ``tp`` between the parallel regions).
* context parallelism over ``cp``: every rank holds part of the sequence (``layout``
  "contiguous" or "zigzag"); attention is ring (``cp_mode="ring"``), Ulysses (``"ulysses"``) or
  hybrid (``"hybrid"``: Ulysses inside ``groups["ulysses"]``, ring across ``groups["ring"]``).
  Parameters are replicated over ``cp``; :meth:`TinyGPT.sync_grads` sums their gradients.

With no groups the same classes give the plain single-process model, initialised identically
(every layer is seeded from ``GPTConfig.seed``), which is the reference the tests train against.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from commlib.parallel import sequence as _seq
from commlib.parallel._autograd import copy_to_group
from commlib.parallel.tensor import (ColumnParallelLinear, ParallelAttention, RowParallelLinear,
                                     SequenceParallelLayerNorm, VocabParallelEmbedding,
                                     vocab_parallel_cross_entropy)

__all__ = ["GPTConfig", "TinyGPT", "GPTStage", "make_groups", "split_layers", "batches", "train"]


@dataclass
class GPTConfig:
    vocab: int = 64
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    max_seq: int = 64
    seed: int = 0


def make_groups(comm, tp_size: int = 1, cp_size: int = 1, ulysses_size: Optional[int] = None) -> dict:
    """Split ``comm`` (tp_size * cp_size ranks) into tensor- and context-parallel groups.

    Returns ``{"tp", "cp"}`` (and ``"ulysses"``, ``"ring"`` when ``ulysses_size`` is given: the
    cp group split as ``cp_rank = ring_rank * ulysses_size + ulysses_rank``). Collective over ``comm``.
    """
    if tp_size * cp_size != comm.size:
        raise ValueError(f"tp_size * cp_size = {tp_size * cp_size} != communicator size {comm.size}")
    r = comm.rank
    g = {"tp": comm.split(r // tp_size, r % tp_size), "cp": comm.split(r % tp_size, r // tp_size)}
    if ulysses_size is not None:
        if cp_size % ulysses_size:
            raise ValueError(f"ulysses_size {ulysses_size} does not divide cp_size {cp_size}")
        c = g["cp"].rank
        g["ulysses"] = g["cp"].split(c // ulysses_size, c % ulysses_size)
        g["ring"] = g["cp"].split(c % ulysses_size, c // ulysses_size)
    return g


class _Block(nn.Module):
    def __init__(self, cfg: GPTConfig, seed: int, tp, cp_arg, cp_mode, layout, sp):
        super().__init__()
        d = cfg.d_model
        self.ln1 = SequenceParallelLayerNorm(d, tp, sequence_parallel=sp)
        self.attn = ParallelAttention(d, cfg.n_heads, tp, causal=True, sequence_parallel=sp, cp=cp_arg,
                                      cp_mode=cp_mode, layout=layout, seed=seed)
        self.ln2 = SequenceParallelLayerNorm(d, tp, sequence_parallel=sp)
        self.fc1 = ColumnParallelLinear(d, 4 * d, tp, sequence_parallel=sp, seed=seed + 1)
        self.fc2 = RowParallelLinear(4 * d, d, tp, sequence_parallel=sp, seed=seed + 2)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Decoder-only transformer (learned positions, pre-LayerNorm blocks, untied LM head).

    Args:
        cfg: sizes and the seed.
        groups: ``None`` (single process) or the dict of :func:`make_groups` (``tp`` and/or ``cp``
            may be None or of size 1).
        cp_mode: ``"ring"``, ``"ulysses"`` or ``"hybrid"`` (needs ``groups["ulysses"/"ring"]``).
        layout: sequence layout over the context-parallel ranks.
        sequence_parallel: Megatron sequence parallelism inside the tensor-parallel group.

    ``forward(tokens, targets)`` takes this rank's tokens (see :meth:`shard`) and returns the loss
    share of this rank: ``sum of its token losses / global token count``, so the shares add up over
    ``cp`` to the mean loss of the whole batch (and are equal over ``tp``).
    """

    def __init__(self, cfg: GPTConfig, groups: Optional[dict] = None, cp_mode: str = "ring",
                 layout: str = "contiguous", sequence_parallel: bool = False):
        super().__init__()
        groups = dict(groups or {})
        self.cfg, self.cp_mode, self.layout = cfg, cp_mode, layout
        self.tp = groups.get("tp")
        self.cp = groups.get("cp")
        if self.tp is not None and self.tp.size == 1:
            self.tp = None
        if self.cp is not None and self.cp.size == 1:
            self.cp = None
        self.sp = bool(sequence_parallel and self.tp is not None)
        if self.cp is None:
            cp_arg = None
        elif cp_mode == "hybrid":
            cp_arg = (groups["ulysses"], groups["ring"])
        else:
            cp_arg = self.cp
        self.groups = groups
        s = cfg.seed
        d = cfg.d_model
        self.wte = VocabParallelEmbedding(cfg.vocab, d, self.tp, sequence_parallel=self.sp, seed=s)
        g = torch.Generator().manual_seed(s + 1)
        self.wpe = nn.Parameter(0.02 * torch.randn(cfg.max_seq, d, generator=g))
        self.blocks = nn.ModuleList(_Block(cfg, s + 10 * (i + 1), self.tp, cp_arg, cp_mode, layout, self.sp)
                                    for i in range(cfg.n_layers))
        self.ln_f = SequenceParallelLayerNorm(d, self.tp, sequence_parallel=self.sp)
        self.head = ColumnParallelLinear(d, cfg.vocab, self.tp, bias=False, sequence_parallel=self.sp,
                                         seed=s + 2)

    # -- sequence placement --------------------------------------------------------------------
    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's part of a full-sequence tensor (tokens: (batch, seq), dim 1)."""
        if self.cp is None:
            return x
        if self.cp_mode == "hybrid":
            u, r = self.groups["ulysses"], self.groups["ring"]
            return _seq.hybrid_split(x, u.rank, u.size, r.rank, r.size, self.layout, dim)
        return _seq.shard_sequence(x, self.cp.rank, self.cp.size, self.layout, dim)

    def _positions(self, n: int) -> torch.Tensor:
        return self.shard(torch.arange(n * (1 if self.cp is None else self.cp.size)), 0)

    # -- model ---------------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.loss(self.logits(x), targets)

    # The pieces of forward, separately callable so that pipeline stages (GPTStage) can run a part.
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings of this rank's tokens: (B, n) -> (B, n', d)."""
        n = tokens.shape[1]
        pos = self._positions(n)
        x = self.wte(tokens)
        wpe = self.wpe
        if self.sp:  # x is split along the sequence over tp: take our positions, sum wpe grads over tp
            k = n // self.tp.size
            pos = pos[self.tp.rank * k:(self.tp.rank + 1) * k]
            wpe = copy_to_group(wpe, self.tp)
        return x + wpe[pos]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and LM head: (B, n', d) -> (B, n, vocab / tp)."""
        return self.head(self.ln_f(x))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """This rank's loss share: sum of its token losses / the global token count of the batch."""
        B, n = targets.shape
        loss = vocab_parallel_cross_entropy(logits, targets, self.tp, reduction="sum")
        return loss / (B * n * (1 if self.cp is None else self.cp.size))

    def sync_grads(self):
        """Sum the gradients of the (cp-replicated) parameters over ``cp`` in one all-reduce."""
        if self.cp is None:
            return
        ps = [p for p in self.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in ps])
        self.cp.all_reduce(flat)
        o = 0
        for p in ps:
            p.grad.copy_(flat[o:o + p.numel()].view_as(p.grad))
            o += p.numel()

    def global_loss(self, share: torch.Tensor) -> float:
        """The whole batch's mean loss from this rank's share (sums over ``cp``)."""
        t = share.detach().reshape(1).clone()
        if self.cp is not None:
            self.cp.all_reduce(t)
        return t.item()


def batches(cfg: GPTConfig, steps: int, batch: int, seq: int, seed: int = 1234):
    """Deterministic (tokens, targets) batches of full sequences: a fixed set of 4 random batches
    cycled, so that a few steps visibly lower the loss."""
    g = torch.Generator().manual_seed(seed)
    data = [torch.randint(0, cfg.vocab, (batch, seq + 1), generator=g) for _ in range(min(steps, 4))]
    for i in range(steps):
        yield data[i % len(data)][:, :-1], data[i % len(data)][:, 1:]


def train(model: TinyGPT, steps: int = 10, batch: int = 2, seq: int = 16, lr: float = 0.5,
          seed: int = 1234) -> list:
    """Plain SGD for ``steps`` steps on :func:`batches`; returns the per-step global losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for tokens, targets in batches(model.cfg, steps, batch, seq, seed):
        opt.zero_grad(set_to_none=True)
        loss = model(model.shard(tokens), model.shard(targets))
        loss.backward()
        model.sync_grads()
        opt.step()
        losses.append(model.global_loss(loss))
    return losses


def train_data_parallel(module, opt, comm, batches, rows_per_rank: int) -> tuple:
    """Data-parallel steps: every rank draws the same global batches and trains on its
    ``rows_per_rank`` rows of each (rank r: rows r*rows_per_rank ..), ``module`` averaging the
    gradients (DataParallel, torch DDP, with or without compression). Returns (the global loss per
    step, averaged over ``comm``; the seconds from the start to the end of each step)."""
    import time

    import numpy as np
    mine = slice(comm.rank * rows_per_rank, (comm.rank + 1) * rows_per_rank)
    losses, times = [], []
    t0 = time.perf_counter()
    for tokens, targets in batches:
        opt.zero_grad(set_to_none=True)
        loss = module(tokens[mine], targets[mine])
        loss.backward()
        opt.step()
        mean = np.array([loss.item()], np.float64)
        comm.all_reduce(mean, op="avg")
        losses.append(float(mean[0]))
        times.append(time.perf_counter() - t0)
    return losses, times


def split_layers(n_layers: int, n_stages: int, sizes: Optional[list] = None) -> list:
    """The blocks of each pipeline stage, as ranges: ``sizes`` (blocks per stage) if given, else as
    even as possible with the earlier stages taking the remainder (they also hold the embedding,
    the last the head; a real model would weigh those)."""
    if sizes is None:
        if n_stages > n_layers:
            raise ValueError(f"n_stages: {n_stages} stages for {n_layers} blocks; give sizes= with empty stages")
        sizes = [n_layers // n_stages + (1 if i < n_layers % n_stages else 0) for i in range(n_stages)]
    if len(sizes) != n_stages or sum(sizes) != n_layers or min(sizes) < 0:
        raise ValueError(f"sizes: {sizes} must be {n_stages} non-negative counts adding up to {n_layers} blocks")
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


class GPTStage(nn.Module):
    """Stage ``stage`` of ``n_stages`` of a :class:`TinyGPT`: the embeddings (first stage), its
    blocks, the final LayerNorm and head (last stage). It shares the model's parameters (build the
    whole TinyGPT on every rank, identically seeded, and keep the stage), and its tensor- and
    context-parallel groups. ``forward`` maps tokens (first) or activations to activations or
    logits (last); :meth:`loss` is the last stage's ``loss_fn``.
    """

    def __init__(self, model: TinyGPT, stage: int, n_stages: int, sizes: Optional[list] = None):
        super().__init__()
        self.first, self.last = stage == 0, stage == n_stages - 1
        self.layers = split_layers(model.cfg.n_layers, n_stages, sizes)[stage]
        self.blocks = nn.ModuleList(model.blocks[i] for i in self.layers)
        if self.first:
            self.wte, self.wpe = model.wte, model.wpe
        if self.last:
            self.ln_f, self.head = model.ln_f, model.head
        self._model = (model,)  # a tuple: not registered as a submodule (its other stages' parameters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        model = self._model[0]
        if self.first:
            x = model.embed(x)
        for blk in self.blocks:
            x = blk(x)
        return model.logits(x) if self.last else x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._model[0].loss(logits, targets)
