"""Rank-side functions for the tensor-parallel tests (run by commlib.testing rank pools); the
sequence-parallel attention cases are in sp_cases.py, the tiny GPT in gpt_cases.py.

Imported as ``parallel.tp_cases`` (tests/ is on the workers' sys.path). Every function takes the
pool's communicator first, checks on every rank, and returns the measured max abs errors so the
pytest side can assert and report them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from commlib.parallel._autograd import all_to_all
from commlib.parallel.tensor import (ColumnParallelLinear, FeatureParallelLinear, ParallelAttention,
                                     RowParallelLinear, SequenceParallelLayerNorm,
                                     VocabParallelEmbedding, choose_strategy,
                                     vocab_parallel_cross_entropy)


def _one_thread(fn):
    """Run a rank-side case with one torch thread (restored afterwards): 2-4 ranks share 2 cores,
    and with torch's default intra-op threads a rank's matmul can stall for minutes while its
    peers wait in a collective (see the report on issue 6)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(n)
    return wrapper


TP_TOL = 1e-5  # fp32: max |sharded - unsharded| / max(1, max |unsharded|)


def _err(a, b) -> float:
    """Max abs error, relative to the reference's scale when that exceeds 1."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1.0)).item()


def _sl(n, comm):
    k = n // comm.size
    return slice(comm.rank * k, (comm.rank + 1) * k)


def _rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _check(errs, tol=TP_TOL):
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"errors above {tol}: {bad}"
    return errs


# ---- linear layers -------------------------------------------------------------------------------
@_one_thread
def column_linear(comm, transposed: bool):
    # exact forward: no cross-rank arithmetic, and with >= 16 local outputs and 32 inputs the CPU
    # BLAS runs the same kernel (same summation order) for the slice as for the full matmul (with
    # tiny widths it picks a different kernel and the last bit differs, sharded or not)
    B, S, IN, OUT = 2, 3, 32, 16 * comm.size
    tp = comm
    ref = torch.manual_seed(11) and nn.Linear(IN, OUT)
    errs = {}
    # seeded init equals slicing the seeded unsharded layer; from_linear shards an existing one
    col = ColumnParallelLinear(IN, OUT, tp, seed=11)
    assert torch.equal(col.weight, ref.weight[_sl(OUT, tp)]) and torch.equal(col.bias, ref.bias[_sl(OUT, tp)])
    for gather in (False, True):
        col = ColumnParallelLinear.from_linear(ref, tp, gather_output=gather)
        x = _rand(B, S, IN, seed=1).requires_grad_()
        xr = x.detach().clone().requires_grad_()
        G = _rand(S, B, OUT, seed=2)  # loss uses the output transposed: non-contiguous grads
        xin = x.transpose(0, 1).contiguous().transpose(0, 1) if transposed else x
        y = col(xin)
        yr = ref(xr)
        if gather:
            assert torch.equal(y, yr), "column-parallel gathered forward is not exact"
            loss = (y.transpose(0, 1) * G).sum()
        else:
            assert torch.equal(y, yr[..., _sl(OUT, tp)]), "column-parallel forward is not exact"
            loss = (y.transpose(0, 1) * G[..., _sl(OUT, tp)]).sum()
        loss.backward()
        (yr.transpose(0, 1) * G).sum().backward()
        errs[f"g{int(gather)}.dx"] = _err(x.grad, xr.grad)
        errs[f"g{int(gather)}.dW"] = _err(col.weight.grad, ref.weight.grad[_sl(OUT, tp)])
        errs[f"g{int(gather)}.db"] = _err(col.bias.grad, ref.bias.grad[_sl(OUT, tp)])
        ref.zero_grad()
    return _check(errs)


@_one_thread
def row_linear(comm, transposed: bool):
    B, S, IN, OUT = 2, 3, 4 * comm.size, 6
    tp = comm
    ref = torch.manual_seed(12) and nn.Linear(IN, OUT)
    row = RowParallelLinear(IN, OUT, tp, seed=12)
    assert torch.equal(row.weight, ref.weight[:, _sl(IN, tp)]) and torch.equal(row.bias, ref.bias)
    errs = {}
    for parallel_in in (True, False):
        row = RowParallelLinear.from_linear(ref, tp, input_is_parallel=parallel_in)
        x = _rand(B, S, IN, seed=3).requires_grad_()
        xr = x.detach().clone().requires_grad_()
        G = _rand(OUT, S, B, seed=4)
        xin = x[..., _sl(IN, tp)] if parallel_in else x
        if transposed:  # a transposed (non-contiguous) input
            xin = xin.transpose(0, 1).contiguous().transpose(0, 1)
        y = row(xin)
        yr = ref(xr)
        errs[f"p{int(parallel_in)}.y"] = _err(y, yr)
        (y.permute(2, 1, 0) * G).sum().backward()
        (yr.permute(2, 1, 0) * G).sum().backward()
        sl = _sl(IN, tp) if parallel_in else slice(None)  # with a parallel input, only our slice
        errs[f"p{int(parallel_in)}.dx"] = _err(x.grad[..., sl], xr.grad[..., sl])
        errs[f"p{int(parallel_in)}.dW"] = _err(row.weight.grad, ref.weight.grad[:, _sl(IN, tp)])
        errs[f"p{int(parallel_in)}.db"] = _err(row.bias.grad, ref.bias.grad)
        ref.zero_grad()
    return _check(errs)


@_one_thread
def mlp(comm, sequence_parallel: bool, device: str = "cpu"):
    """Column -> GELU -> Row (Megatron MLP), optionally sequence-parallel with a LayerNorm in front
    whose gradients must be all-reduced over the group; the parallel layers on ``device``, the
    reference on the CPU."""
    B, S, D = 2, 2 * comm.size, 8
    tp = comm
    torch.manual_seed(5)
    ln_r, fc1, fc2 = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    with torch.no_grad():
        ln_r.weight.normal_()
        ln_r.bias.normal_()
    ln = SequenceParallelLayerNorm(D, tp, sequence_parallel=sequence_parallel)
    ln.load_state_dict(ln_r.state_dict())
    c = ColumnParallelLinear.from_linear(fc1, tp, sequence_parallel=sequence_parallel)
    r = RowParallelLinear.from_linear(fc2, tp, sequence_parallel=sequence_parallel)
    ln, c, r = ln.to(device), c.to(device), r.to(device)
    x = _rand(B, S, D, seed=6).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    G = _rand(B, S, D, seed=7)
    yr = fc2(F.gelu(fc1(ln_r(xr))))
    xin = x[:, _sl(S, tp)] if sequence_parallel else x
    y = r(F.gelu(c(ln(xin.to(device)))))
    errs = {}
    if sequence_parallel:
        errs["y"] = _err(y, yr[:, _sl(S, tp)])
        (y * G[:, _sl(S, tp)].to(device)).sum().backward()
    else:
        errs["y"] = _err(y, yr)
        (y * G.to(device)).sum().backward()
    (yr * G).sum().backward()
    sl = _sl(S, tp) if sequence_parallel else slice(None)  # sequence-parallel: only our part
    errs["dx"] = _err(x.grad[:, sl], xr.grad[:, sl])
    errs["ln.dw"] = _err(ln.weight.grad, ln_r.weight.grad)
    errs["ln.db"] = _err(ln.bias.grad, ln_r.bias.grad)
    errs["fc1.dW"] = _err(c.weight.grad, fc1.weight.grad[_sl(4 * D, tp)])
    errs["fc2.dW"] = _err(r.weight.grad, fc2.weight.grad[:, _sl(4 * D, tp)])
    errs["fc2.db"] = _err(r.bias.grad, fc2.bias.grad)
    return _check(errs)


@_one_thread
def feature_linear(comm):
    tp = comm
    errs = {}
    for IN, OUT in ((4 * comm.size, 2 * comm.size), (2 * comm.size, 6 * comm.size)):
        ref = torch.manual_seed(13) and nn.Linear(IN, OUT)
        for strategy in ("gather", "scatter", "auto"):
            m = FeatureParallelLinear.from_linear(ref, tp, strategy=strategy)
            assert m.strategy == (strategy if strategy != "auto" else choose_strategy(IN, OUT))
            x = _rand(3, 2, IN, seed=8).requires_grad_()
            xr = x.detach().clone().requires_grad_()
            G = _rand(3, 2, OUT, seed=9)
            y = m(x[..., _sl(IN, tp)])
            yr = ref(xr)
            (y * G[..., _sl(OUT, tp)]).sum().backward()
            (yr * G).sum().backward()
            k = f"{IN}x{OUT}.{strategy}"
            errs[k + ".y"] = _err(y, yr[..., _sl(OUT, tp)])
            errs[k + ".dx"] = _err(x.grad[..., _sl(IN, tp)], xr.grad[..., _sl(IN, tp)])
            dW = ref.weight.grad[_sl(OUT, tp)] if m.strategy == "gather" else ref.weight.grad[:, _sl(IN, tp)]
            errs[k + ".dW"] = _err(m.weight.grad, dW)
            errs[k + ".db"] = _err(m.bias.grad, ref.bias.grad[_sl(OUT, tp)])
            ref.zero_grad()
    return _check(errs)


# ---- vocabulary-parallel embedding and loss --------------------------------------------------------
@_one_thread
def vocab_parallel(comm, sequence_parallel: bool):
    tp = comm
    V, D, B, S = 5 * comm.size, 6, 2, 2 * comm.size
    ref = torch.manual_seed(14) and nn.Embedding(V, D)
    emb = VocabParallelEmbedding(V, D, tp, seed=14, sequence_parallel=sequence_parallel)
    assert torch.equal(emb.weight, ref.weight[_sl(V, tp)])
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(15))
    G = _rand(B, S, D, seed=16)
    e = emb(ids)
    er = ref(ids)
    errs = {}
    if sequence_parallel:
        errs["emb.y"] = _err(e, er[:, _sl(S, tp)])
        (e * G[:, _sl(S, tp)]).sum().backward()
    else:
        errs["emb.y"] = _err(e, er)
        (e.transpose(0, 1) * G.transpose(0, 1)).sum().backward()
    (er * G).sum().backward()
    errs["emb.dW"] = _err(emb.weight.grad, ref.weight.grad[_sl(V, tp)])
    # cross-entropy over vocab-split logits, a few ignored targets, transposed logits
    logits = (3 * _rand(S, B, V, seed=17)).requires_grad_()
    lr = logits.detach().clone().requires_grad_()
    tgt = ids.clone()
    tgt[0, 0] = -100
    local = logits[..., _sl(V, tp)].transpose(0, 1)  # (B, S, V/P), non-contiguous
    for red in ("mean", "sum", "none"):
        loss = vocab_parallel_cross_entropy(local, tgt, tp, reduction=red)
        lref = F.cross_entropy(lr.transpose(0, 1).reshape(-1, V), tgt.reshape(-1), reduction=red)
        errs[f"ce.{red}"] = _err(loss.reshape(-1), lref.reshape(-1))
    loss = vocab_parallel_cross_entropy(local, tgt, tp)
    loss.backward()
    F.cross_entropy(lr.transpose(0, 1).reshape(-1, V), tgt.reshape(-1)).backward()
    errs["ce.dlogits"] = _err(logits.grad[..., _sl(V, tp)], lr.grad[..., _sl(V, tp)])
    return _check(errs)


# ---- attention with heads split ---------------------------------------------------------------------
@_one_thread
def parallel_attention(comm, sequence_parallel: bool):
    tp = comm
    D, H, B, S = 4 * comm.size, 2 * comm.size, 2, 2 * comm.size
    mha = torch.manual_seed(18) and nn.MultiheadAttention(D, H, batch_first=True)
    pa = ParallelAttention(D, H, tp, seed=18)
    assert torch.equal(pa.qkv.weight[: D // comm.size], mha.in_proj_weight[_sl(D, tp)])
    with torch.no_grad():  # non-zero biases so their gradients are checked too
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    pa = ParallelAttention.from_mha(mha, tp, causal=True, sequence_parallel=sequence_parallel)
    x = _rand(B, S, D, seed=19).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    G = _rand(B, S, D, seed=20)
    mask = torch.ones(S, S, dtype=torch.bool).triu(1)
    yr = mha(xr, xr, xr, attn_mask=mask, need_weights=False)[0]
    errs = {}
    if sequence_parallel:
        y = pa(x[:, _sl(S, tp)])
        errs["y"] = _err(y, yr[:, _sl(S, tp)])
        (y * G[:, _sl(S, tp)]).sum().backward()
    else:
        y = pa(x)
        errs["y"] = _err(y, yr)
        (y * G).sum().backward()
    (yr * G).sum().backward()
    sl = _sl(S, tp) if sequence_parallel else slice(None)  # sequence-parallel: only our part
    errs["dx"] = _err(x.grad[:, sl], xr.grad[:, sl])
    n = D // comm.size
    s = comm.rank * n
    dWin = torch.cat([mha.in_proj_weight.grad[i * D + s:i * D + s + n] for i in range(3)])
    dbin = torch.cat([mha.in_proj_bias.grad[i * D + s:i * D + s + n] for i in range(3)])
    errs["dWqkv"] = _err(pa.qkv.weight.grad, dWin)
    errs["dbqkv"] = _err(pa.qkv.bias.grad, dbin)
    errs["dWo"] = _err(pa.proj.weight.grad, mha.out_proj.weight.grad[:, s:s + n])
    errs["dbo"] = _err(pa.proj.bias.grad, mha.out_proj.bias.grad)
    return _check(errs)


@_one_thread
def all_to_all_grad(comm):
    """The differentiable all_to_all against its definition, fed transposed (non-contiguous) grads."""
    P = comm.size
    xs = [_rand(2, 2 * P, 3, seed=100 + r) for r in range(P)]  # rank r's input (scatter dim 1)
    x = xs[comm.rank].clone().requires_grad_()
    y = all_to_all(x, comm, scatter_dim=1, gather_dim=2)  # (2, 2, 3P)
    expect = torch.cat([xs[r][:, 2 * comm.rank:2 * comm.rank + 2] for r in range(P)], dim=2)
    assert torch.equal(y, expect)
    Gs = [_rand(3 * P, 2, 2, seed=200 + r) for r in range(P)]  # rank r's incoming grad, transposed
    (y * Gs[comm.rank].permute(2, 1, 0)).sum().backward()
    dx = torch.zeros_like(x)
    for r in range(P):  # rank r's output got block [:, 2r:2r+2] of my x at positions [.., my*3:(my+1)*3]
        dx[:, 2 * r:2 * r + 2] = Gs[r].permute(2, 1, 0)[..., 3 * comm.rank:3 * comm.rank + 3]
    return _check({"a2a.dx": _err(x.grad, dx)}, 0.0)
