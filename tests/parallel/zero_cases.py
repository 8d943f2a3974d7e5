"""Rank-side functions for the ZeRO tests beyond training equivalence (run by commlib.testing rank
pools, imported as ``parallel.zero_cases``): sharded checkpoints, ZeRO-3's state dicts, wrap
policies, mixed precision and prefetch, ZeRO-1/2's state dicts, overlap and parameter groups. The
models, the single-process reference and the tolerance (dp_cases.TOL) are in dp_cases.py.
"""
from __future__ import annotations

import torch

from parallel.dp_cases import (MLP, STEPS, Block, _setup, batch, digest, loss_fn, make_model, make_optimizer,
                               reference, rel_err, shard)


# -- checkpoints ----------------------------------------------------------------------------------
def _ckpt_objects(comm, method, name):
    model, opt, state, params = _setup(comm, method, name)
    return model, opt, state, params


def _train_steps(comm, method, name, model, opt, state, params, first, last, ref):
    errs, digests = [], []
    for s in range(first, last):
        x, y = batch(name, s)
        opt.zero_grad()
        loss_fn(model(shard(x, comm.rank, comm.size)), shard(y, comm.rank, comm.size)).backward()
        opt.step()
        errs.append(rel_err(state(), ref[s]))
        digests.append(digest(params()))
    return errs, digests


def checkpoint_save(comm, method, name, path, k):
    """Train k steps and save a sharded checkpoint; return the per-step digests."""
    torch.set_num_threads(1)
    ref = reference(name)
    model, opt, state, params = _ckpt_objects(comm, method, name)
    errs, digests = _train_steps(comm, method, name, model, opt, state, params, 0, k, ref)
    if method == "zero3":
        model.save_sharded_checkpoint(path, opt)
    else:
        opt.save_sharded_checkpoint(path)
    return {"errs": errs, "digests": digests}


def checkpoint_resume(comm, method, name, path, k, steps=STEPS):
    """Build a fresh model (other init), load the checkpoint, train steps k..steps-1."""
    torch.set_num_threads(1)
    ref = reference(name)
    model, opt, state, params = _ckpt_objects(comm, method, name)
    if method == "zero3":
        model.load_sharded_checkpoint(path, opt)
    else:
        opt.load_sharded_checkpoint(path)
    loaded_err = rel_err(state(), ref[k - 1])
    errs, digests = _train_steps(comm, method, name, model, opt, state, params, k, steps, ref)
    return {"errs": [loaded_err] + errs, "digests": digests}


def checkpoint_mismatch(comm, path):
    """Loading a checkpoint into a different model raises a clear error."""
    from commlib.parallel import FullyShardedModule
    torch.manual_seed(0)
    model = FullyShardedModule(MLP(hidden=17), comm)
    try:
        model.load_sharded_checkpoint(path)
    except ValueError as e:
        return str(e)
    return None


# -- ZeRO-3 extras --------------------------------------------------------------------------------
def fsdp_state_dicts(comm):
    """full_state_dict on every rank vs rank0_only; keys are the original module's names."""
    from commlib.parallel import FullyShardedModule
    torch.manual_seed(0)
    ref = make_model("transformer").state_dict()
    model = FullyShardedModule(make_model("transformer", seed=comm.rank), comm)
    full = model.full_state_dict()
    r0 = model.full_state_dict(rank0_only=True)
    same = list(full.keys()) == list(ref.keys()) and all(torch.equal(full[k], ref[k]) for k in ref)
    r0_ok = (r0 == {}) if comm.rank else (list(r0) == list(full) and
                                          all(torch.equal(r0[k], full[k]) for k in full))
    # load_full_state_dict round trip
    sd = {k: v + 1 for k, v in ref.items()}
    model.load_full_state_dict(sd)
    back = model.full_state_dict()
    return {"same": same, "r0_ok": r0_ok, "units": model.unit_names,
            "roundtrip": all(torch.equal(back[k], sd[k]) for k in sd),
            "n_params": len(list(model.parameters()))}


def fsdp_wrap_policy(comm, policy):
    """Nested units chosen by a callable or a list; training still matches the reference."""
    from commlib.parallel import FullyShardedModule
    torch.set_num_threads(1)
    name = "transformer2"
    ref = reference(name, 4)
    wrap = {"blocks": lambda n, m: isinstance(m, Block),
            "list": ["blocks.1", "head"], "none": None}[policy]
    model = FullyShardedModule(make_model(name, seed=comm.rank), comm, wrap=wrap,
                               prefetch=policy != "list")
    cls, okw = make_optimizer(name, None)
    opt = cls(model.parameters(), **okw)
    errs, digests = [], []
    for s in range(4):
        x, y = batch(name, s)
        opt.zero_grad()
        loss_fn(model(shard(x, comm.rank, comm.size)), shard(y, comm.rank, comm.size)).backward()
        opt.step()
        st = model.full_state_dict()
        errs.append(rel_err(st, ref[s]))
        digests.append(digest(st.values()))
    return {"errs": errs, "digests": digests, "units": model.unit_names}


def fsdp_mixed_precision(comm, steps=5):
    """bf16 compute with fp32 master weights and fp32 gradient reduction."""
    from commlib.parallel import FullyShardedModule
    torch.set_num_threads(1)
    name = "transformer"
    ref = reference(name, steps)
    model = FullyShardedModule(make_model(name, seed=comm.rank), comm, mixed_precision=torch.bfloat16)
    cls, okw = make_optimizer(name, None)
    opt = cls(model.parameters(), **okw)
    errs, digests, out_dtype = [], [], None
    for s in range(steps):
        x, y = batch(name, s)
        opt.zero_grad()
        out = model(shard(x, comm.rank, comm.size))
        out_dtype = str(out.dtype)
        loss_fn(out, shard(y, comm.rank, comm.size)).backward()
        opt.step()
        st = model.full_state_dict()
        errs.append(rel_err(st, ref[s]))
        digests.append(digest(st.values()))
    dtypes = sorted({str(p.dtype) for p in model.parameters()} |
                    {str(p.grad.dtype) for p in model.parameters()} |
                    {str(v.dtype) for st in opt.state.values() for v in st.values() if v.dim()})
    return {"errs": errs, "digests": digests, "out_dtype": out_dtype, "master_dtypes": dtypes}


def zero_state_dict_roundtrip(comm, stage):
    """ZeroOptimizer.state_dict/load_state_dict on the same world size continue bitwise."""
    import commlib.parallel as par
    torch.set_num_threads(1)
    name = "transformer"

    def run(steps, load=None):
        torch.manual_seed(0)
        model = make_model(name)
        cls, okw = make_optimizer(name, None)
        opt = par.ZeroOptimizer(cls, model.parameters(), comm, stage=stage, bucket_cap_mb=0.001,
                                **okw)
        if load is not None:
            model.load_state_dict(load[0])
            opt.load_state_dict(load[1])
        for s in steps:
            x, y = batch(name, s)
            opt.zero_grad()
            loss_fn(model(shard(x, comm.rank, comm.size)), shard(y, comm.rank, comm.size)).backward()
            opt.step()
        return model, opt

    m, o = run(range(3))
    saved = ({k: v.clone() for k, v in m.state_dict().items()}, o.state_dict())
    m_full, _ = run(range(5))
    m_res, _ = run(range(3, 5), load=saved)
    return digest(m_full.parameters()) == digest(m_res.parameters())


def zero2_overlap(comm):
    """ZeRO-2 launches bucket reduce-scatters from the backward hooks."""
    import commlib.parallel as par
    torch.manual_seed(0)
    model = make_model("transformer2")
    opt = par.ZeroOptimizer(torch.optim.SGD, model.parameters(), comm, stage=2, bucket_cap_mb=0.002,
                            lr=0.1)
    x, y = batch("transformer", 0)
    loss_fn(model(x), y).backward()
    opt.step()
    return opt.last_backward_stats


# -- more ZeRO-3 and ZeRO-1/2 --------------------------------------------------------------------
def fsdp_prefetch(comm, prefetch):
    """Prefetch statistics of the second training step (forward order known by then)."""
    from commlib.parallel import FullyShardedModule
    torch.set_num_threads(1)
    model = FullyShardedModule(make_model("transformer"), comm, prefetch=prefetch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch("transformer", 0)
    for _ in range(2):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return dict(model.prefetch_stats)


def zero_param_groups(comm, stage, steps=4):
    """Param groups (no weight decay on biases and norms, a different lr) are honoured."""
    import commlib.parallel as par
    torch.set_num_threads(1)
    name = "transformer"

    def groups(model):
        decay = [p for n, p in model.named_parameters() if p.dim() > 1]
        no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
        return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0, "lr": 5e-4}]

    torch.manual_seed(0)
    ref_model = make_model(name)
    ref_opt = torch.optim.AdamW(groups(ref_model), lr=1e-3, weight_decay=0.1)
    model = make_model(name, seed=comm.rank)
    opt = par.ZeroOptimizer(torch.optim.AdamW, groups(model), comm, stage=stage,
                            bucket_cap_mb=0.001, lr=1e-3, weight_decay=0.1)
    errs, digests = [], []
    for s in range(steps):
        x, y = batch(name, s)
        ref_opt.zero_grad()
        loss_fn(ref_model(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        loss_fn(model(shard(x, comm.rank, comm.size)), shard(y, comm.rank, comm.size)).backward()
        opt.step()
        errs.append(rel_err(model.state_dict(), ref_model.state_dict()))
        digests.append(digest(model.parameters()))
    return {"errs": errs, "digests": digests,
            "groups": [(g["lr"], g["weight_decay"]) for g in opt.param_groups]}
