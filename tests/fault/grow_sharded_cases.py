"""Rank-side cases of test_grow_sharded.py: ZeroOptimizer (stage 1 and 2) and FullyShardedModule
train on the pool's ranks, grow by joiners (commlib.testing.ExtraRank processes), and every rank,
joiners included, checks what it holds against a reference: the same wrapper built at the grown
size that loads a sharded checkpoint written just before the grow."""
from __future__ import annotations

import os
import signal

import torch

import commlib
from commlib.bootstrap.store import TCPStore

KINDS = ("zero1", "zero2", "fsdp")
LR, SCHEDULED_LR = 1e-2, 5e-3  # the constructor's, and what the members set before the grow


def _job(comm, port, prefix):
    """The pool's ranks as a job of their own (``prefix``) over the pool's store at ``port``."""
    return commlib.init(rank=comm.rank, world_size=comm.size, store=TCPStore("127.0.0.1", port), prefix=prefix)


def _model(seed):
    torch.manual_seed(seed)  # a joiner's and a reference's start differ from the members'
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _build(kind, comm, seed, joining=False):
    """(the model to call, the wrapper, the optimizer) of ``kind`` over ``comm``; with ``joining``,
    a joiner's ``joined``."""
    from commlib.parallel import FullyShardedModule, ZeroOptimizer
    model = _model(seed)
    if kind == "fsdp":
        def adam(ps):
            return torch.optim.AdamW(ps, lr=LR)
        if joining:
            fsdp, opt = FullyShardedModule.joined(model, comm, optimizer=adam)
        else:
            fsdp = FullyShardedModule(model, comm)
            opt = adam(fsdp.parameters())
        return fsdp, fsdp, opt
    stage = int(kind[-1])
    make = ZeroOptimizer.joined if joining else ZeroOptimizer
    # a tiny bucket cap: two buckets (units) of 31 and 35 elements, uneven pieces on 2, 3 and 5 ranks
    zero = make(torch.optim.AdamW, model.parameters(), comm, stage=stage, bucket_cap_mb=1e-4, lr=LR)
    return model, zero, zero.optimizer


def _backward(model, step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
    ((model(x) - y) ** 2).mean().backward()


def _zero(wrapper, opt):
    """ZeroOptimizer's zero_grad (stage 1's flat gradient too), else the optimizer's."""
    (wrapper if hasattr(wrapper, "stage") else opt).zero_grad()


def _step(model, wrapper, opt, step, comm):
    _zero(wrapper, opt)
    _backward(model, step, comm.rank)
    (wrapper if hasattr(wrapper, "stage") else opt).step()


def _full(comm, pieces):
    """The whole vector of every unit from each rank's piece (all_gather over ``comm``)."""
    out = []
    for p in pieces:
        whole = torch.empty(p.numel() * comm.size, dtype=p.dtype)
        comm.all_gather(whole, p.detach().contiguous())
        out.append(whole)
    return out


def _everything(wrapper, opt, comm):
    """Every unit's parameters, gradient and optimizer state as whole vectors (bytes of the
    first numel elements): what a grow must keep, gathered over the world it is on."""
    units = wrapper._units
    shards = [u.shard for u in units]
    numels = [u.layout.numel for u in units]
    out = {"param": _full(comm, shards)}
    if getattr(wrapper, "stage", 2) == 2:  # stage 1 keeps whole local gradients, not pieces
        out["grad"] = _full(comm, [s.grad for s in shards])
    for key in ("exp_avg", "exp_avg_sq"):
        out[key] = _full(comm, [opt.state[s][key] for s in shards])
    return {k: [t[:n].numpy().tobytes() for t, n in zip(v, numels)] for k, v in out.items()}


def _mine(wrapper, opt):
    """What this rank holds, piece by piece (padding included): shards, optimizer state, lr."""
    out = []
    for u in wrapper._units:
        st = opt.state[u.shard]
        out.append((u.shard.detach().numpy().tobytes(), st["exp_avg"].numpy().tobytes(),
                    st["exp_avg_sq"].numpy().tobytes(), float(st["step"])))
    return out, [g["lr"] for g in opt.param_groups]


def after_grow(kind, model, wrapper, opt, path):
    """On every rank of the grown job: what it holds, against the reference (a wrapper built at the
    grown size loading the checkpoint ``path``); then two steps on both. Returns (rank, size,
    everything gathered, mine, the reference's, mine after two steps, the reference's)."""
    comm = wrapper.comm
    everything = _everything(wrapper, opt, comm)
    _zero(wrapper, opt)
    ref_model, ref, ref_opt = _build(kind, comm, seed=7)
    if kind == "fsdp":
        ref.load_sharded_checkpoint(path, ref_opt)
    else:
        ref.load_sharded_checkpoint(path)
    got, want = _mine(wrapper, opt), _mine(ref, ref_opt)
    for step in (3, 4):
        _step(model, wrapper, opt, step, comm)
        _step(ref_model, ref, ref_opt, step, comm)
    out = (comm.rank, comm.size, everything, got, want, _mine(wrapper, opt), _mine(ref, ref_opt))
    comm.close()
    return out


def case_grow(comm, port, joiners, root):
    """The pool's ranks, as one job per kind over the pool's store: two steps, a backward whose
    gradients stay (the grow moves them), the checkpoint, the grow by ``joiners``, after_grow."""
    torch.set_num_threads(1)
    results = []
    for kind in KINDS:
        c = _job(comm, port, f"sharded-{kind}")
        model, wrapper, opt = _build(kind, c, seed=comm.rank)
        for step in (0, 1):
            _step(model, wrapper, opt, step, c)
        for g in opt.param_groups:
            g["lr"] = SCHEDULED_LR       # a scheduler's change: the joiners must get it
        _zero(wrapper, opt)
        _backward(model, 2, c.rank)      # gradients in flight between steps
        path = os.path.join(root, f"{kind}-{comm.size}")
        wrapper.save_sharded_checkpoint(path, *([opt] if kind == "fsdp" else []))
        before = _everything(wrapper, opt, c)
        grown_args = (joiners, 60) if kind != "fsdp" else (joiners, 60, opt)
        wrapper.grow(*grown_args)
        results.append((before, after_grow(kind, model, wrapper, opt, path)))
    return results


def joiner_grows(root, members):
    """A joiner of every kind's job in turn."""
    torch.set_num_threads(1)
    results = []
    for kind in KINDS:
        c = commlib.join(prefix=f"sharded-{kind}", timeout=60)
        model, wrapper, opt = _build(kind, c, seed=50 + c.rank, joining=True)
        results.append(after_grow(kind, model, wrapper, opt, os.path.join(root, f"{kind}-{members}")))
    return results


def case_kill_shrink(comm, port, victim, root):
    """One job per kind: two steps, a checkpoint, then ``victim`` dies and each survivor's next
    step raises; ``shrink(checkpoint=)`` goes on at the smaller size. Returns per kind (the
    error's class, mine after the shrink, the reference's: a wrapper built at the smaller size
    loading the checkpoint, then both after one more step); the refusal without a checkpoint."""
    torch.set_num_threads(1)
    jobs = {}
    for kind in KINDS:
        c = _job(comm, port, f"shrink-{kind}")
        model, wrapper, opt = _build(kind, c, seed=comm.rank)
        for step in (0, 1):
            _step(model, wrapper, opt, step, c)
        path = os.path.join(root, f"shrink-{kind}")
        wrapper.save_sharded_checkpoint(path, *([opt] if kind == "fsdp" else []))
        jobs[kind] = (model, wrapper, opt, path)
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    results = {}
    for kind, (model, wrapper, opt, path) in jobs.items():
        try:
            _step(model, wrapper, opt, 2, wrapper.comm)
            raised = None
        except Exception as exc:  # noqa: BLE001 (the class is what the test checks)
            raised = type(exc).__name__
        try:
            wrapper.shrink()
            refused = None
        except ValueError as exc:
            refused = str(exc)
        wrapper.shrink(checkpoint=path, **({"optimizer": opt} if kind == "fsdp" else {}))
        c = wrapper.comm
        ref_model, ref, ref_opt = _build(kind, c, seed=7)
        ref.load_sharded_checkpoint(path, *([ref_opt] if kind == "fsdp" else []))
        got, want = _mine(wrapper, opt), _mine(ref, ref_opt)
        _step(model, wrapper, opt, 2, c)
        _step(ref_model, ref, ref_opt, 2, c)
        results[kind] = (raised, refused, c.rank, c.size, got, want, _mine(wrapper, opt), _mine(ref, ref_opt))
        c.close()
    return results


def case_joiner_dies_during_the_move(comm, port, root):
    """FullyShardedModule grows by a joiner that dies once admitted, before its shards arrive:
    every member raises, and ``shrink(checkpoint=)`` takes them back to their own size from the
    checkpoint written before the grow. Returns (the error's class and the size the wrapper was on
    then, size after the shrink, mine, the reference's)."""
    torch.set_num_threads(1)
    c = _job(comm, port, "doomed-fsdp")
    model, wrapper, opt = _build("fsdp", c, seed=comm.rank)
    _step(model, wrapper, opt, 0, c)
    path = os.path.join(root, "doomed-fsdp")
    wrapper.save_sharded_checkpoint(path, opt)
    try:
        wrapper.grow(1, 60, opt)
        raised = None
    except Exception as exc:  # noqa: BLE001 (the class is what the test checks)
        raised = (type(exc).__name__, wrapper.comm.size)  # 4: the grow was done, the move failed
    wrapper.shrink(checkpoint=path, optimizer=opt)
    c = wrapper.comm
    ref_model, ref, ref_opt = _build("fsdp", c, seed=7)
    ref.load_sharded_checkpoint(path, ref_opt)
    out = (raised, c.size, _mine(wrapper, opt), _mine(ref, ref_opt))
    c.close()
    return out


def joiner_dies():
    """Admitted to the grow, then SIGKILLed before the members' state reaches it."""
    commlib.join(prefix="doomed-fsdp", timeout=60)
    os.kill(os.getpid(), signal.SIGKILL)


def _grow_error(fn):
    try:
        fn()
        return None
    except ValueError as exc:
        return str(exc)


def case_joiners_with_other_units(comm, port):
    """Each wrapper grows by a joiner built with other arguments (FullyShardedModule: another
    ``wrap``; ZeroOptimizer: another ``bucket_cap_mb``), so its units differ: ValueError on every
    rank before any piece moves. Returns the messages."""
    torch.set_num_threads(1)
    messages = []
    for kind in ("fsdp", "zero2"):
        _, wrapper, _ = _build(kind, _job(comm, port, f"units-{kind}"), seed=comm.rank)
        messages.append(_grow_error(lambda: wrapper.grow(1, 60)))
        wrapper.comm.close()  # the grown communicator: the grow was done, the move refused
    return messages


def joiner_with_other_units(kind):
    from commlib.parallel import FullyShardedModule, ZeroOptimizer
    c = commlib.join(prefix=f"units-{kind}", timeout=60)
    if kind == "fsdp":  # units "0" and the root's instead of "0" and "2"
        message = _grow_error(lambda: FullyShardedModule.joined(_model(0), c, wrap=["0"]))
    else:               # the default bucket cap: one unit instead of two
        message = _grow_error(lambda: ZeroOptimizer.joined(torch.optim.AdamW, _model(0).parameters(), c,
                                                           stage=2, lr=LR))
    c.close()
    return message
