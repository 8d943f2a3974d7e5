"""Sequence (context) parallel attention on commlib communicators: ring, Ulysses and their hybrid.

Conventions (as ``torch.nn.functional.scaled_dot_product_attention``): ``q``, ``k``, ``v`` are
``(batch, heads, local_seq, head_dim)`` and hold this rank's part of the sequence; the result has
the shape of ``q``. Groups are passed explicitly (commlib communicators, e.g. from ``comm.split``).

Sequence layouts (``layout=``):

* ``"contiguous"``: rank r holds positions ``[r*n, (r+1)*n)``.
* ``"zigzag"``: the global sequence is cut into 2P chunks; rank r holds chunks r and 2P-1-r,
  concatenated in that order (:func:`zigzag_split` / :func:`zigzag_merge`). With a causal mask
  every rank then does the same amount of work in ring attention.

Algorithms:

* :func:`ring_attention`: K/V blocks travel around the ring (rank r sends to r+1, receives from
  r-1) while the block already here is being processed; partial results are merged with the
  online-softmax (log-sum-exp) rule. Causal blocks that are entirely masked are skipped (with
  zigzag, off-diagonal steps compute exactly half a block). The backward pass recomputes each
  block from the saved log-sum-exp; dK/dV accumulators travel around the ring with the K/V blocks
  and arrive back at their owner after P hops. Scores and the merge are computed in float32 for
  float16/bfloat16 inputs, in float64 for float64 and float32 for float32.
* :func:`ulysses_attention`: an all-to-all turns the sequence-split q/k/v into head-split ones over
  the whole sequence, local attention, and the inverse all-to-all.
* :func:`hybrid_attention`: Ulysses inside a group (fast links), ring across groups.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from commlib.parallel._autograd import all_to_all

__all__ = ["ring_attention", "ulysses_attention", "hybrid_attention", "zigzag_split", "zigzag_merge",
           "shard_sequence", "merge_sequence", "positions", "hybrid_split", "hybrid_positions"]

_LAYOUTS = ("contiguous", "zigzag")


# ---- layouts -------------------------------------------------------------------------------------
def _check_layout(layout):
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected 'contiguous' or 'zigzag', got {layout!r}")


def zigzag_split(x: torch.Tensor, rank: int, size: int, dim: int = 2) -> torch.Tensor:
    """This rank's zigzag part of the full sequence ``x`` along ``dim``: chunks ``rank`` and
    ``2*size-1-rank`` of ``2*size`` equal chunks, concatenated in that order."""
    n = x.shape[dim]
    if n % (2 * size):
        raise ValueError(f"zigzag_split: sequence length {n} is not a multiple of 2*size = {2 * size}")
    c = n // (2 * size)
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * size - 1 - rank) * c, c)], dim)


def zigzag_merge(parts: Sequence[torch.Tensor], dim: int = 2) -> torch.Tensor:
    """Inverse of :func:`zigzag_split`: ``parts[r]`` is rank r's part; returns the full sequence."""
    firsts, seconds = [], []
    for p in parts:
        a, b = p.chunk(2, dim)
        firsts.append(a)
        seconds.append(b)
    return torch.cat(firsts + seconds[::-1], dim)


def shard_sequence(x: torch.Tensor, rank: int, size: int, layout: str = "contiguous", dim: int = 2):
    """This rank's part of the full sequence ``x`` (along ``dim``) under ``layout``."""
    _check_layout(layout)
    if layout == "zigzag":
        return zigzag_split(x, rank, size, dim)
    n = x.shape[dim]
    if n % size:
        raise ValueError(f"shard_sequence: sequence length {n} does not divide over {size} ranks")
    return x.narrow(dim, rank * (n // size), n // size)


def merge_sequence(parts: Sequence[torch.Tensor], layout: str = "contiguous", dim: int = 2):
    """Inverse of :func:`shard_sequence` given every rank's part (rank order)."""
    _check_layout(layout)
    return zigzag_merge(parts, dim) if layout == "zigzag" else torch.cat(list(parts), dim)


def positions(rank: int, size: int, local_len: int, layout: str = "contiguous") -> torch.Tensor:
    """Global positions (int64) of the ``local_len`` tokens rank ``rank`` holds under ``layout``."""
    return shard_sequence(torch.arange(local_len * size), rank, size, layout, 0)


def hybrid_split(x: torch.Tensor, ulysses_rank: int, ulysses_size: int, ring_rank: int, ring_size: int,
                 layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The input layout of :func:`hybrid_attention`: the sequence is first split over the ring
    groups under ``layout``, then each ring group's part is cut contiguously over its Ulysses ranks."""
    part = shard_sequence(x, ring_rank, ring_size, layout, dim)
    return shard_sequence(part, ulysses_rank, ulysses_size, "contiguous", dim)


def hybrid_positions(ulysses_rank, ulysses_size, ring_rank, ring_size, local_len, layout="contiguous"):
    """Global positions of this rank's tokens under :func:`hybrid_split`."""
    n = local_len * ulysses_size * ring_size
    return hybrid_split(torch.arange(n), ulysses_rank, ulysses_size, ring_rank, ring_size, layout, 0)


# ---- ring attention ------------------------------------------------------------------------------
def _compute_dtype(dt: torch.dtype) -> torch.dtype:
    return torch.float64 if dt == torch.float64 else torch.float32


_ALL = slice(None)


def _plan(r: int, src: int, causal: bool, layout: str, n: int):
    """Sub-blocks rank r computes against the K/V block of rank src.

    Returns (list of (q_slice, kv_slice, diagonal_mask), tiles) where tiles counts the useful
    (chunk x chunk) tiles of size (n/2)^2 computed: the unit in which zigzag balances exactly.
    """
    if not causal:
        return [(_ALL, _ALL, False)], 4
    if src == r:
        return [(_ALL, _ALL, True)], 3
    if layout == "contiguous":
        return ([(_ALL, _ALL, False)], 4) if src < r else ([], 0)
    h = n // 2
    if src < r:  # both my chunks come after its first chunk, before its second
        return [(_ALL, slice(0, h), False)], 2
    return [(slice(h, None), _ALL, False)], 2  # only my second chunk sees its (earlier) chunks


def _scores(q, k, scale, diag):
    s = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)
    if diag:
        n = s.shape[-1]
        mask = torch.ones(s.shape[-2], n, dtype=torch.bool, device=s.device).tril_()
        s.masked_fill_(~mask, float("-inf"))
    return s


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm, causal, layout, scale, stats):
        P = 1 if comm is None else comm.size
        r = 0 if comm is None else comm.rank
        B, H, n, D = q.shape
        cdt = _compute_dtype(q.dtype)
        qc = q.to(cdt)
        out = torch.zeros(B, H, n, v.shape[-1], dtype=cdt, device=q.device)
        lse = torch.full((B, H, n), float("-inf"), dtype=cdt, device=q.device)
        kv = torch.stack([k, v]).contiguous()  # one message per hop, in the input dtype
        nxt = torch.empty_like(kv) if P > 1 else None
        steps = tiles = 0
        for t in range(P):
            src = (r - t) % P
            work = None
            if t < P - 1:  # start the next hop, then compute on the block we hold
                work = comm.sendrecv(kv, (r + 1) % P, nxt, (r - 1) % P, async_op=True)
            plan, w = _plan(r, src, causal, layout, n)
            steps += bool(plan)
            tiles += w
            for qs, ks, diag in plan:
                s = _scores(qc[:, :, qs], kv[0, :, :, ks].to(cdt), scale, diag)
                lb = torch.logsumexp(s, dim=-1)
                ob = torch.matmul(torch.exp(s - lb.unsqueeze(-1)), kv[1, :, :, ks].to(cdt))
                la = lse[:, :, qs]
                new = torch.logaddexp(la, lb)
                out[:, :, qs] = (out[:, :, qs] * torch.exp(la - new).unsqueeze(-1)
                                 + ob * torch.exp(lb - new).unsqueeze(-1))
                lse[:, :, qs] = new
            if work is not None:
                work.wait()
                kv, nxt = nxt, kv
        if stats is not None:
            stats.update(steps=steps, tiles=tiles, world=P, rank=r)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.causal, ctx.layout, ctx.scale = comm, causal, layout, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm, causal, layout, scale = ctx.comm, ctx.causal, ctx.layout, ctx.scale
        P = 1 if comm is None else comm.size
        r = 0 if comm is None else comm.rank
        n = q.shape[2]
        cdt = out.dtype
        qc = q.to(cdt)
        do = dout.contiguous().to(cdt)
        delta = (do * out).sum(-1, keepdim=True)  # (B, H, n, 1)
        dq = torch.zeros_like(qc)
        kv = torch.stack([k, v]).contiguous()
        nxt = torch.empty_like(kv) if P > 1 else None
        pending = dkv_in = None
        for t in range(P):
            src = (r - t) % P
            work = None
            if t < P - 1:
                work = comm.sendrecv(kv, (r + 1) % P, nxt, (r - 1) % P, async_op=True)
            dkv = torch.zeros(kv.shape, dtype=cdt, device=q.device)  # grads for block src
            for qs, ks, diag in _plan(r, src, causal, layout, n)[0]:
                kb, vb, qb, dob = kv[0, :, :, ks].to(cdt), kv[1, :, :, ks].to(cdt), qc[:, :, qs], do[:, :, qs]
                p = torch.exp(_scores(qb, kb, scale, diag) - lse[:, :, qs].unsqueeze(-1))
                dkv[1, :, :, ks] += torch.matmul(p.transpose(-2, -1), dob)
                ds = p * (torch.matmul(dob, vb.transpose(-2, -1)) - delta[:, :, qs])
                dq[:, :, qs] += torch.matmul(ds, kb).mul_(scale)
                dkv[0, :, :, ks] += torch.matmul(ds.transpose(-2, -1), qb).mul_(scale)
            if P > 1:
                if pending is not None:  # the accumulator for block src, from rank r-1
                    pending.wait()
                    dkv += dkv_in
                dkv_in = torch.empty_like(dkv)
                pending = comm.sendrecv(dkv, (r + 1) % P, dkv_in, (r - 1) % P, async_op=True)
            else:
                dkv_in = dkv
            if work is not None:
                work.wait()
                kv, nxt = nxt, kv
        if pending is not None:
            pending.wait()  # after P hops our own block's accumulator is back
        return (dq.to(q.dtype), dkv_in[0].to(k.dtype), dkv_in[1].to(v.dtype),
                None, None, None, None, None)


def _check_qkv(q, k, v, name):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{name}: q, k, v must be (batch, heads, seq, head_dim)")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"{name}: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "do not match")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{name}: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp, causal: bool = False,
                   layout: str = "contiguous", scale: Optional[float] = None,
                   stats: Optional[dict] = None) -> torch.Tensor:
    """Attention over the whole sequence split across ``cp`` (a commlib communicator; ``None``
    means one rank), computed by rotating K/V around the ring. Differentiable.

    Args:
        q, k, v: (batch, heads, local_seq, head_dim), this rank's part of the sequence under
            ``layout`` (any strides; non-contiguous views are fine).
        causal: token i attends to tokens j <= i (global positions).
        layout: ``"contiguous"`` or ``"zigzag"`` (see the module docstring; zigzag needs an even
            local length).
        scale: softmax scale, ``1/sqrt(head_dim)`` by default.
        stats: if a dict, filled with ``steps`` (ring steps where this rank computed something),
            ``tiles`` (computed (S/2P)^2 tiles, diagonal tiles counted once) -- the per-rank work.
    """
    _check_qkv(q, k, v, "ring_attention")
    _check_layout(layout)
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"ring_attention: layout='zigzag' needs an even local length, got {q.shape[2]}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if cp is not None and cp.size == 1:
        cp = None
    return _RingAttention.apply(q, k, v, cp, bool(causal), layout, float(scale), stats)


# ---- Ulysses ---------------------------------------------------------------------------------------
def _local_attention(q, k, v, causal, pos, scale):
    """Attention on whole sequences (positions ``pos``, in the order they are held)."""
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if bool((pos[1:] > pos[:-1]).all()):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    # pos lives on the CPU (the order check above needs no device sync); the mask must sit on q's
    # device, or CUDA's attention refuses it.
    mask = (pos.unsqueeze(1) >= pos.unsqueeze(0)).to(q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _seq_to_heads(q, k, v, group, name):
    P = group.size
    H = q.shape[1]
    if H % P:
        raise ValueError(f"{name}: {H} heads do not divide evenly over the Ulysses group of {P} ranks "
                         f"(heads must be a multiple of the group size)")
    qkv = torch.stack([q, k, v])  # (3, B, H, n, D): one all-to-all for all three
    return all_to_all(qkv, group, scatter_dim=2, gather_dim=3).unbind(0)  # (B, H/P, P*n, D) each


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, causal: bool = False,
                      layout: str = "contiguous", scale: Optional[float] = None) -> torch.Tensor:
    """DeepSpeed-Ulysses attention over the sequence split across ``group``. Differentiable.

    An all-to-all turns (B, H, n, D) sequence-split tensors into (B, H/P, P*n, D) head-split
    tensors over the whole sequence; attention runs locally; the inverse all-to-all restores the
    sequence split. ``heads`` must be a multiple of ``group.size`` (ValueError otherwise).
    ``layout`` tells the causal mask where each rank's tokens sit.
    """
    _check_qkv(q, k, v, "ulysses_attention")
    _check_layout(layout)
    P, n = group.size, q.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    qh, kh, vh = _seq_to_heads(q, k, v, group, "ulysses_attention")
    pos = torch.cat([positions(r, P, n, layout) for r in range(P)])
    o = _local_attention(qh, kh, vh, causal, pos, scale)
    return all_to_all(o, group, scatter_dim=2, gather_dim=1)


# ---- hybrid ----------------------------------------------------------------------------------------
def hybrid_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ulysses_group, ring_group,
                     causal: bool = False, layout: str = "contiguous", scale: Optional[float] = None,
                     stats: Optional[dict] = None) -> torch.Tensor:
    """2D sequence parallelism: Ulysses inside ``ulysses_group`` (e.g. the ranks of one node),
    ring attention across ``ring_group`` (one rank per Ulysses group, e.g. across nodes).
    Differentiable.

    The input layout is :func:`hybrid_split`: the sequence is split over the ring groups under
    ``layout``, and each group's part contiguously over its Ulysses ranks. The all-to-all gives
    each rank its ring group's whole part for ``heads / ulysses_group.size`` heads; ring attention
    over ``ring_group`` completes the sequence; the inverse all-to-all restores the split.
    """
    _check_qkv(q, k, v, "hybrid_attention")
    _check_layout(layout)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    qh, kh, vh = _seq_to_heads(q, k, v, ulysses_group, "hybrid_attention")
    o = ring_attention(qh, kh, vh, ring_group, causal=causal, layout=layout, scale=scale, stats=stats)
    return all_to_all(o, ulysses_group, scatter_dim=2, gather_dim=1)
