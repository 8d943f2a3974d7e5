"""Helpers the tensor-parallel layers share (tensor.py, vocab_parallel.py): a group's rank and
size (``None`` = unsharded), even shards, seeded construction and parameter copies."""
from __future__ import annotations

import torch
from torch import nn


def _rank_size(tp):
    return (0, 1) if tp is None else (tp.rank, tp.size)


def _shard(n: int, tp, what: str):
    r, p = _rank_size(tp)
    if n % p:
        raise ValueError(f"{what}: {n} does not divide evenly over the tensor-parallel group of {p} ranks")
    return r * (n // p), n // p


def _seeded(seed: int, make):
    """Run ``make()`` with the global RNG seeded to ``seed``, restoring the RNG state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone().contiguous())
