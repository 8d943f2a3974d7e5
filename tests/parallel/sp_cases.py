"""Rank-side functions for the sequence-parallel attention tests (ring, zigzag, Ulysses, hybrid;
run by commlib.testing rank pools, imported as ``parallel.sp_cases``). The helpers shared with the
tensor-parallel cases are in tp_cases.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from commlib.parallel import sequence as SQ
from parallel.tp_cases import _err, _one_thread, _rand

ATTN_TOL = {"float32": 1e-5, "float64": 1e-12,  # max abs error against float64 full attention
            "bfloat16": 2e-2}  # max abs error / max(1, max |reference|)


def _hybrid_groups(comm, U):
    """(ulysses, ring) groups: rank = ring_rank * U + ulysses_rank."""
    ug = comm.split(comm.rank // U, comm.rank % U)
    rg = comm.split(comm.rank % U, comm.rank // U)
    return ug, rg


def _reference(qf, kf, vf, Gf, causal):
    """Full attention in float64 on the whole sequence; returns out, dq, dk, dv."""
    q, k, v = (t.detach().double().requires_grad_() for t in (qf, kf, vf))
    S = q.shape[2]
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    o = s.softmax(-1) @ v
    (o * Gf.double()).sum().backward()
    return o.detach(), q.grad, k.grad, v.grad


@_one_thread
def attention_suite(comm, dtype_name: str, algos=("ring", "ulysses", "hybrid"), device: str = "cpu"):
    """Every algorithm x causal x layout against full attention, forward and backward; the
    sharded q/k/v on ``device``, the reference on the CPU.

    q/k/v are handed in as transposed views of (B, n, H, D) leaves (non-contiguous), and the loss
    uses the output transposed, so the incoming gradient is non-contiguous too.
    """
    dt = getattr(torch, dtype_name)
    P, r = comm.size, comm.rank
    B, H, D, n = 2, 2 * P, 8, 4
    S = n * P
    qf, kf, vf, Gf = (_rand(B, H, S, D, seed=30 + i).to(dt) for i in range(4))
    configs = []
    for algo in algos:
        if algo == "hybrid":
            for U in sorted({d for d in (1, 2, P) if P % d == 0}):
                configs.append(("hybrid", U))
        else:
            configs.append((algo, None))
    groups = {U: _hybrid_groups(comm, U) for a, U in configs if a == "hybrid"}
    # float32/float64: absolute error; bfloat16: relative to max(1, max |reference|)
    measure = _err if dt == torch.bfloat16 else (lambda a, b: (a.detach().double().cpu() - b).abs().max().item())
    errs = {}
    for algo, U in configs:
        for causal in (False, True):
            ref = _reference(qf, kf, vf, Gf, causal)
            for layout in ("contiguous", "zigzag"):
                if algo == "hybrid":
                    ug, rg = groups[U]
                    shard = lambda x: SQ.hybrid_split(x, ug.rank, ug.size, rg.rank, rg.size, layout)  # noqa: E731
                else:
                    shard = lambda x: SQ.shard_sequence(x, r, P, layout)  # noqa: E731
                leaves = [shard(t).transpose(1, 2).contiguous().to(device).requires_grad_() for t in (qf, kf, vf)]
                q, k, v = (t.transpose(1, 2) for t in leaves)  # non-contiguous (B, H, n, D)
                if algo == "ring":
                    o = SQ.ring_attention(q, k, v, comm, causal=causal, layout=layout)
                elif algo == "ulysses":
                    o = SQ.ulysses_attention(q, k, v, comm, causal=causal, layout=layout)
                else:
                    o = SQ.hybrid_attention(q, k, v, ug, rg, causal=causal, layout=layout)
                G = shard(Gf).transpose(1, 2).contiguous().to(device)
                (o.transpose(1, 2) * G).sum().backward()
                key = f"{algo}{'' if U is None else f'(U={U})'}.{'causal' if causal else 'full'}.{layout}"
                for name, got, want in (("out", o, ref[0]), ("dq", leaves[0].grad.transpose(1, 2), ref[1]),
                                        ("dk", leaves[1].grad.transpose(1, 2), ref[2]),
                                        ("dv", leaves[2].grad.transpose(1, 2), ref[3])):
                    errs[f"{key}.{name}"] = measure(got, shard(want))
    return errs


@_one_thread
def single_device_error(comm, dtype_name: str):
    """Error of one-process SDPA in ``dtype`` on the whole sequence (the baseline for bf16)."""
    dt = getattr(torch, dtype_name)
    P = comm.size
    B, H, D, S = 2, 2 * P, 8, 4 * P
    qf, kf, vf, Gf = (_rand(B, H, S, D, seed=30 + i).to(dt) for i in range(4))
    out = {}
    for causal in (False, True):
        ref = _reference(qf, kf, vf, Gf, causal)
        q, k, v = (t.clone().requires_grad_() for t in (qf, kf, vf))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (o * Gf).sum().backward()
        out[causal] = max(_err(a, b) for a, b in zip((o, q.grad, k.grad, v.grad), ref))
    return out


@_one_thread
def zigzag_balance(comm):
    """Per-rank work of causal ring attention under both layouts (ring steps, tiles)."""
    P = comm.size
    res = {}
    for layout in ("contiguous", "zigzag"):
        q = _rand(1, 2, 4, 8, seed=40 + comm.rank)
        st = {}
        SQ.ring_attention(q, q, q, comm, causal=True, layout=layout, stats=st)
        res[layout] = (st["steps"], st["tiles"])
        st = {}
        SQ.ring_attention(q, q, q, comm, causal=False, layout=layout, stats=st)
        assert st["tiles"] == 4 * P
    return res


@_one_thread
def ulysses_bad_heads(comm):
    q = torch.zeros(1, comm.size + 1, 4, 8)
    try:
        SQ.ulysses_attention(q, q, q, comm)
    except ValueError as e:
        return str(e)
    raise AssertionError("no ValueError for heads not divisible by the group size")
