"""Rank-side functions: the tiny GPT trained 3D/4D (Mesh: TP x CP x PP x DP) against single process.

float64 throughout, tolerance GPT_PP_TOL = 1e-10: the parallel run only reorders sums (vocab and
row-parallel all-reduces, ring attention's online softmax, micro-batch and data-parallel gradient
sums), a few ulps per operation; any wrong shard, missing micro-batch or unsynchronised gradient
moves losses and parameters by >1e-4.
"""
from __future__ import annotations

import torch

from commlib.models.gpt import GPTConfig, GPTStage, TinyGPT
from commlib.parallel import Mesh, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleZeroBubble

GPT_PP_TOL = 1e-10
LR, BATCH, SEQ = 0.5, 8, 8
SCHEDULES = {"1f1b": Schedule1F1B, "zero_bubble": ScheduleZeroBubble, "interleaved": ScheduleInterleaved1F1B}


def _data(cfg, step):
    g = torch.Generator().manual_seed(1000 + step)
    d = torch.randint(0, cfg.vocab, (BATCH, SEQ + 1), generator=g)
    return d[:, :-1], d[:, 1:]


def _sgd(params):
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= LR * p.grad
                p.grad = None


def _reference(cfg, steps):
    model = TinyGPT(cfg).double()
    losses = []
    for step in range(steps):
        tokens, targets = _data(cfg, step)
        loss = model(tokens, targets)
        loss.backward()
        _sgd(model.parameters())
        losses.append(loss.item())
    return losses, model


def _rows(t, comm):
    k = t.shape[0] // comm.size
    return t[comm.rank * k:(comm.rank + 1) * k]


def gpt_mesh_train(comm, tp, cp, pp, dp, kind="1f1b", v=1, m=2, steps=2, n_layers=3):
    """Train the tiny GPT on a (tp, cp, pp, dp) mesh with ``kind``; return the worst errors."""
    torch.set_num_threads(1)
    cfg = GPTConfig(n_layers=n_layers)
    ref_losses, ref = _reference(cfg, steps)
    mesh = Mesh(comm, tp=tp, cp=cp, pp=pp, dp=dp)
    model = TinyGPT(cfg, {"tp": mesh.tp, "cp": mesh.cp}).double()
    S = pp * v
    # an uneven split of the blocks: the first stage takes the remainder
    stages = [GPTStage(model, s, S) for s in range(mesh.pp.rank, S, pp)]
    from commlib.parallel import PipelineStage
    pstages = [PipelineStage(st, st_i, S, mesh.pp) for st, st_i in zip(stages, range(mesh.pp.rank, S, pp))]
    sched = SCHEDULES[kind](pstages if v > 1 else pstages[0], n_microbatches=m, loss_fn=stages[-1].loss)
    params = [p for st in stages for p in st.parameters()]
    first, last = stages[0].first, stages[-1].last
    losses = []
    try:
        for step in range(steps):
            tokens, targets = _data(cfg, step)
            tok, tgt = model.shard(_rows(tokens, mesh.dp)), model.shard(_rows(targets, mesh.dp))
            mb_losses = []
            sched.step(*([tok] if first else []), **({"target": tgt, "losses": mb_losses} if last else {}))
            model.sync_grads()  # sum over cp (parameters are replicated there)
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            mesh.dp.all_reduce(flat, op="avg")  # data parallel: the mean over the dp replicas
            o = 0
            for p in params:
                p.grad.copy_(flat[o:o + p.numel()].view_as(p.grad))
                o += p.numel()
            _sgd(params)
            if last:
                share = torch.tensor([sum(x.item() for x in mb_losses) / m], dtype=torch.float64)
                if mesh.cp.size > 1:
                    mesh.cp.all_reduce(share)
                mesh.dp.all_reduce(share, op="avg")
                losses.append(share.item())
    finally:
        sched.close()
    tpc = mesh.tp
    V, D = cfg.vocab, cfg.d_model
    errs = {}
    if last:
        errs["loss"] = max(abs(a - b) for a, b in zip(losses, ref_losses))
        errs["head"] = (model.head.weight - _rows(ref.head.weight, tpc)).abs().max().item()
        errs["ln_f.b"] = (model.ln_f.bias - ref.ln_f.bias).abs().max().item()
    if first:
        errs["wte"] = (model.wte.weight - _rows(ref.wte.weight, tpc)).abs().max().item()
        errs["wpe"] = (model.wpe - ref.wpe).abs().max().item()
    for st in stages:
        for i in st.layers:
            k = 4 * D // tpc.size
            mine = model.blocks[i].fc2.weight
            want = ref.blocks[i].fc2.weight[:, tpc.rank * k:(tpc.rank + 1) * k]
            errs[f"blocks.{i}.fc2"] = (mine - want).abs().max().item()
            errs[f"blocks.{i}.ln1.w"] = (model.blocks[i].ln1.weight - ref.blocks[i].ln1.weight).abs().max().item()
    mesh.close()
    return errs
