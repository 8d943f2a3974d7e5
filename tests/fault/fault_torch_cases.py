"""Rank-side cases of the torch fault tests: a rank is SIGKILLed in the middle of training.

Workers import this module by name (the test puts this directory on sys.path). Each case runs in a
fresh pool (``commlib.testing.run_killing_one_rank``): the victim's death retires the pool.
"""
from __future__ import annotations

import datetime
import os
import signal
import time

import torch
import torch.distributed as dist

from commlib.bootstrap.ports import free_port


def init_torch(comm, timeout_s: float = 20):
    """The default "commlib" process group over the pool's ranks (tcp:// rendezvous on a port
    rank 0 picks and shares through the pool's communicator)."""
    import commlib.torch  # noqa: F401  (registers the backend)
    port = torch.zeros(1, dtype=torch.int64)
    if comm.rank == 0:
        port[0] = free_port()
    comm.broadcast(port, root=0)
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{int(port.item())}",
                            rank=comm.rank, world_size=comm.size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def die():
    """SIGKILL this process: no cleanup, no goodbye to the peers (as an OOM kill or a lost node)."""
    os.kill(os.getpid(), signal.SIGKILL)


def two_layer_model(seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).to(dtype)


def batch(step: int, rank: int, n: int = 4, dtype=torch.float32):
    """This rank's batch at ``step`` (deterministic, so a one-process replay can rebuild it)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 8, generator=g, dtype=dtype), torch.randn(n, 4, generator=g, dtype=dtype)


# -- survivors shrink and train on (float64, exact: training_replay.py) -----------------------------
def _members(me: int) -> list:
    """The original ranks of the default group's members, in group order."""
    out = torch.zeros(dist.get_world_size(), dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([me], dtype=torch.int64))
    return out.tolist()


SHRUNK = {}  # how the last shrunk default group was made (see _shrink_default_group)


def _shrink_default_group():
    import commlib.torch as ct
    dead = ct.dead_ranks()
    dist.shrink_group(dead, shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    # What torch's own path builds on the C++ backend (issue #44): torch's ProcessGroup with the
    # shrunk CommlibBackend registered by torch itself; install()'s wrapper returns a Python group
    # only for Python-only groups (commlib/torch/shrink.py).
    pg = dist.distributed_c10d._get_default_group()
    SHRUNK.update(group=type(pg).__name__, cpu_backend=type(pg._get_backend(torch.device("cpu"))).__name__)
    return dead


def case_dist_all_reduce_shrink(comm, victim, kill_step=2):
    """Gradients summed with dist.all_reduce; ``victim`` dies at ``kill_step``; the survivors
    shrink the default group (dist.shrink_group) and redo the step. Returns (params bytes,
    members by step, error message, excluded ranks, new rank, how torch made the shrunk group)."""
    import training_replay as tr
    torch.set_num_threads(1)
    init_torch(comm)
    me = comm.rank
    w, members_by_step, message, dead, step = torch.zeros(tr.DIM, dtype=torch.float64), [], None, None, 0
    members = _members(me)
    while step < tr.STEPS:
        if step == kill_step and me == victim:
            die()
        g = torch.from_numpy(tr.gradient(w.numpy(), step, me))
        try:
            dist.all_reduce(g)
        except Exception as exc:  # noqa: BLE001 - PeerError from the blocking path
            message = f"{type(exc).__name__}: {exc}"
            dead = _shrink_default_group()
            members = _members(me)
            continue
        w -= tr.LR * g
        members_by_step.append(members)
        step += 1
    out = (w.numpy().tobytes(), members_by_step, message, dead, dist.get_rank(), dict(SHRUNK))
    dist.destroy_process_group()
    return out


class Sgd:
    """Plain SGD, ``p -= lr * grad`` with torch.optim.SGD's arithmetic (``add_`` with ``alpha``):
    constructing a torch optimizer imports torch._dynamo, about 25 s per rank on a busy 2-core
    machine, the bulk of these tests' time otherwise."""

    def __init__(self, model, lr):
        self.params, self.lr = list(model.parameters()), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.add_(p.grad, alpha=-self.lr)


def _sum_hook(state, bucket):
    """DDP comm hook: the bucket's sum, undivided (keeps the float64 sums exact)."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _linear():
    import training_replay as tr
    model = torch.nn.Linear(tr.DIM, 1, bias=False).to(torch.float64)
    with torch.no_grad():
        model.weight.zero_()
    return model


def _loss(model, step, rank):
    import training_replay as tr
    x, y = (torch.from_numpy(a) for a in tr.batch(step, rank))
    return 0.5 * ((model(x).squeeze(1) - y) ** 2).sum()  # gradient: x^T (x w - y)


def case_ddp_shrink(comm, victim, kill_step=2, fsdp_steps=2):
    """torch DDP (its default averaging: 4 ranks, exact) until ``victim`` dies at ``kill_step``
    before its backward. The survivors' ``loss.backward()`` must raise (it used to crash with
    SIGSEGV); they shrink the default group, build DDP again on it (summing hook: 3 ranks) and redo
    the step; then FSDP2 on the shrunk group trains a fresh model ``fsdp_steps`` steps. Returns
    (params bytes, members by step, error message, seconds the backward took to raise, FSDP2 full
    parameters as bytes)."""
    import gc

    import training_replay as tr
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    init_torch(comm)
    me = comm.rank
    model = _linear()
    ddp = DDP(model)  # the default path: bucket all_reduce, futures, the reducer's callbacks
    opt = Sgd(model, tr.LR)
    members_by_step, message, took, step = [], None, None, 0
    members = _members(me)
    while step < tr.STEPS:
        opt.zero_grad()
        loss = _loss(ddp, step, me)
        if step == kill_step and me == victim:
            die()
        t0 = time.monotonic()
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - RuntimeError carrying the PeerError
            message, took = f"{type(exc).__name__}: {exc}", time.monotonic() - t0
        else:
            opt.step()
            members_by_step.append(members)
            step += 1
            continue
        del ddp, loss  # the old reducer's autograd hooks go with it
        gc.collect()
        _shrink_default_group()
        members = _members(me)
        ddp = DDP(model)
        ddp.register_comm_hook(None, _sum_hook)
    params = model.weight.detach().reshape(-1).numpy().tobytes()
    del ddp
    fsdp = _fsdp_steps(members, fsdp_steps)
    dist.destroy_process_group()
    return params, members_by_step, message, took, fsdp


def _fsdp_steps(members, steps):
    """FSDP2 (fully_shard) over the shrunk default group trains a fresh linear model ``steps``
    steps on the members' batches; returns the full parameters (bytes)."""
    import training_replay as tr
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Linear(tr.DIM, 2, bias=False).to(torch.float64)
    with torch.no_grad():
        model.weight.zero_()
    fully_shard(model, mesh=mesh)
    opt = Sgd(model, tr.LR)
    me = members[dist.get_rank()]
    for step in range(steps):
        opt.zero_grad()
        x, y = (torch.from_numpy(a) for a in tr.batch(step, me))
        (0.5 * ((model(x) - y[:, None]) ** 2).sum()).backward()
        opt.step()
    return model.weight.full_tensor().reshape(-1).detach().numpy().tobytes()


def case_commlib_dp_shrink(comm, victim, kill_step=1):
    """commlib.parallel.DataParallel on the pool's communicator (3 ranks: it averages); ``victim``
    dies at ``kill_step``; the survivors call ``DataParallel.shrink()`` and redo the step. Returns
    (params bytes, members by step, error message)."""
    import training_replay as tr
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    me = comm.rank
    model = _linear()
    dp = DataParallel(model, comm)
    opt = Sgd(model, tr.LR)
    members_by_step, message, step = [], None, 0
    members = list(range(comm.size))
    while step < tr.STEPS:
        opt.zero_grad()
        loss = _loss(dp, step, me)
        if step == kill_step and me == victim:
            die()
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - PeerError from the end of backward
            message = f"{type(exc).__name__}: {exc}"
            dp.shrink()
            members = [r for r in members if r != victim]
            continue
        opt.step()
        members_by_step.append(members)
        step += 1
    return model.weight.detach().reshape(-1).numpy().tobytes(), members_by_step, message, dp.comm.size


def torch_replay(members_by_step, divisors):
    """``training_replay.replay`` computed with the same torch ops as the ranks (forward, backward,
    SGD), for runs whose parameters leave the exact range: every rank's gradient is then the same
    bits here, and a sum of two is the same in either order."""
    import training_replay as tr
    model = _linear()
    opt = Sgd(model, tr.LR)
    for step, members in enumerate(members_by_step):
        total = None
        for r in sorted(members):
            probe = _linear()
            with torch.no_grad():
                probe.weight.copy_(model.weight)
            _loss(probe, step, r).backward()
            total = probe.weight.grad if total is None else total + probe.weight.grad
        model.weight.grad = total / divisors[step]
        opt.step()
    return model.weight.detach().reshape(-1).numpy().tobytes()
