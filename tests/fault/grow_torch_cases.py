"""Rank-side cases of test_grow_torch.py: DataParallel (with a momentum optimizer and a buffer)
trains on 2 ranks, rank 1 is SIGKILLed, rank 0 shrinks and trains alone, a replacement joins
(DataParallel.joined) and both finish; and a one-process replay of the same sequence."""
from __future__ import annotations

import os
import signal

import torch

import commlib
from commlib.bootstrap.store import TCPStore
from commlib.errors import PeerError

import training_replay as tr

KILL_AT, GROW_AT = 2, 4  # the steps at which rank 1 dies and a replacement joins
MOMENTUM = 0.5


class Counted(torch.nn.Module):
    """A linear model (float64, zero weights) and a buffer counting its forward calls: the joiner
    must get it from rank 0 (DataParallel(broadcast_buffers=False) never sends it otherwise)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(tr.DIM, 1, bias=False).to(torch.float64)
        with torch.no_grad():
            self.lin.weight.zero_()
        self.register_buffer("calls", torch.zeros(1, dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def _optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=tr.LR, momentum=MOMENTUM)


def _loss(model, step, rank):
    x, y = (torch.from_numpy(a) for a in tr.batch(step, rank))
    return 0.5 * ((model(x).squeeze(1) - y) ** 2).sum()


def _train(dp, opt, step, sizes, victim=None):
    """Steps ``step``.. : a PeerError in backward shrinks (the step is redone); at GROW_AT a
    group smaller than 2 grows back to 2; ``victim`` (this rank, if given) dies at KILL_AT."""
    while step < tr.STEPS:
        if step == GROW_AT and dp.comm.size < 2:
            dp.grow(1, timeout=60, optimizer=opt)
        opt.zero_grad()
        if step == KILL_AT and victim == dp.comm.rank:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = _loss(dp, step, dp.comm.rank)
        try:
            loss.backward()
        except PeerError:
            dp.shrink()
            continue
        opt.step()
        sizes.append(dp.comm.size)
        step += 1
    model = dp.module
    momentum = opt.state[model.lin.weight]["momentum_buffer"]
    out = (model.lin.weight.detach().reshape(-1).numpy().tobytes(), momentum.reshape(-1).numpy().tobytes(),
           int(model.calls.item()), sizes, dp.comm.rank)
    dp.comm.close()
    return out


def case_dp_kill_shrink_grow(comm, port):
    """The pool's 2 ranks as job "dpjob" over the pool's store (at ``port``); rank 1 dies."""
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    c = commlib.init(rank=comm.rank, world_size=comm.size, store=TCPStore("127.0.0.1", port), prefix="dpjob")
    model = Counted()
    dp = DataParallel(model, c, broadcast_buffers=False)
    out = _train(dp, _optimizer(model), 0, [], victim=1)
    return out + (replay(out[3]),)  # here, where torch.optim is imported already (the forkserver's)


def joiner_dp():
    """The replacement: joins "dpjob", receives the model and optimizer state, trains to the end."""
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    c = commlib.join(prefix="dpjob", timeout=60)
    model = Counted()
    opt = _optimizer(model)
    dp = DataParallel.joined(model, c, optimizer=opt, broadcast_buffers=False)
    return _train(dp, opt, GROW_AT, [])


def replay(sizes):
    """One process, no commlib: step i averages the gradients of ranks 0..sizes[i]-1 (their
    batches), then the same SGD with momentum. Returns (weights bytes, momentum bytes)."""
    model = Counted()
    opt = _optimizer(model)
    for step, size in enumerate(sizes):
        total = None
        for r in range(size):
            probe = Counted()
            with torch.no_grad():
                probe.lin.weight.copy_(model.lin.weight)
            _loss(probe, step, r).backward()
            total = probe.lin.weight.grad if total is None else total + probe.lin.weight.grad
        opt.zero_grad()
        model.lin.weight.grad = total / size
        opt.step()
    momentum = opt.state[model.lin.weight]["momentum_buffer"]
    return model.lin.weight.detach().reshape(-1).numpy().tobytes(), momentum.reshape(-1).numpy().tobytes()


# -- torch: dist.shrink_group, then commlib.torch.grow_group / join_group, DDP rebuilt each time ----
def _ddp_train(model, step, sizes, victim=None):
    """DDP over the default group from ``step``: a failed backward shrinks the default group
    (dist.shrink_group) and DDP is built again; at GROW_AT a group of 1 grows back to 2
    (grow_group) and DDP is built again (its construction sends rank 0's parameters)."""
    import gc

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import commlib.torch as ct
    from fault_torch_cases import Sgd, _fsdp_steps
    ddp, opt = DDP(model), Sgd(model, tr.LR)
    while step < tr.STEPS:
        if step == GROW_AT and dist.get_world_size() < 2:
            del ddp
            gc.collect()
            ct.grow_group(1, timeout=60)
            ddp = DDP(model)
        opt.zero_grad()
        if step == KILL_AT and victim == dist.get_rank():
            os.kill(os.getpid(), signal.SIGKILL)
        loss = _loss(ddp, step, dist.get_rank())
        try:
            loss.backward()
        except RuntimeError:  # carries the PeerError
            del ddp, loss
            gc.collect()
            dist.shrink_group(ct.dead_ranks(), shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
            ddp = DDP(model)
            continue
        opt.step()
        sizes.append(dist.get_world_size())
        step += 1
    del ddp
    # a group made after the grow: the same name on the joiner as on the members (group_count)
    pair = dist.new_group([0, 1])
    ranks = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(ranks, group=pair)
    # FSDP2 on the grown default group: a fresh model, two steps on ranks 0 and 1's batches
    fsdp = _fsdp_steps(list(range(dist.get_world_size())), 2)
    out = (model.lin.weight.detach().reshape(-1).numpy().tobytes(), sizes, dist.get_rank(),
           dist.distributed_c10d._get_default_group().group_desc, int(ranks.item()), fsdp)
    dist.destroy_process_group()
    return out


def _init_torch(comm, port):
    """The pool's ranks init torch (tcp://: rank 0 serves torch's store, whose port goes to the
    joiner through the pool's store at ``port``)."""
    import torch.distributed as dist

    import fault_torch_cases as ftc
    torch.set_num_threads(1)
    ftc.init_torch(comm, timeout_s=60)
    if comm.rank == 0:
        store = dist.distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        TCPStore("127.0.0.1", port).set("torch_store_port", str(store.port))


def _join_torch(group_name="0"):
    """A replacement's default group: torch's store (rank 0's), commlib.join through it, for the
    group torch named ``group_name`` on the members (the default group's is "0")."""
    import torch.distributed as dist

    import commlib.torch as ct
    torch.set_num_threads(1)
    pool_store = TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]))
    torch_port = int(bytes(pool_store.get("torch_store_port")).decode())
    pool_store.close()
    store = dist.TCPStore("127.0.0.1", torch_port, is_master=False)
    comm = commlib.join(**ct.join_arguments(store, group_name=group_name), timeout=60)
    ct.join_group(comm, store)


def case_ddp_kill_shrink_grow(comm, port):
    """Train under DDP; rank 1 dies at KILL_AT (see _ddp_train)."""
    _init_torch(comm, port)
    return _ddp_train(Counted(), 0, [], victim=1)


def joiner_ddp():
    _join_torch()
    return _ddp_train(Counted(), GROW_AT, [])


def _all_ranks_group_sum():
    """A group made after the grow (named by torch's counter) over every rank: the sum of ranks,
    and how this rank reaches each of the grown world (self, shm on its host, tcp across)."""
    import torch.distributed as dist

    import commlib.torch as ct
    group = dist.new_group(list(range(dist.get_world_size())))
    x = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(x, group=group)
    out = (dist.get_world_size(), int(x.item()), ct.get_communicator().topology.links)
    dist.destroy_process_group()
    return out


def _fsdp2_model(seed):
    """Two linear layers, each fully_shard'ed (FSDP2) over the default group, with AdamW."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import torch.distributed as dist
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _full_state(model, opt, **options):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, **options))


def _fsdp2_state_bytes(model, opt):
    """The whole model and optimizer state (every rank gets it), as bytes by name."""
    msd, osd = _full_state(model, opt)
    out = {k: v.numpy().tobytes() for k, v in msd.items()}
    for k, st in osd["state"].items():
        out.update({f"{k}.{n}": v.numpy().tobytes() for n, v in st.items()})
    return out


def _fsdp2_after_grow(state):
    """FSDP2 on the grown default group, loaded with the members' full state (rank 0's, broadcast)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    model, opt = _fsdp2_model(seed=9)
    msd, osd = state
    # the model and the optimizer apart: set_state_dict takes an empty model state dict (every
    # rank but 0's) for "optimizer only" and the ranks would part ways
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, msd, options=options)
    set_optimizer_state_dict(model, opt, osd, options=options)
    return _fsdp2_state_bytes(model, opt)


def case_grow_group_without_a_shrink(comm, port, with_fsdp2):
    """A scale-up: the members grow from 2 to 3 straight after init (their group counter is 1).
    A group made before the grow is destroyed with the old default group: using it raises. With
    ``with_fsdp2``, FSDP2 state trained on 2 ranks reaches the 3 through torch's full state dict."""
    import torch.distributed as dist

    import commlib.torch as ct
    _init_torch(comm, port)
    before = dist.new_group([0, 1])
    trained = state = None
    if with_fsdp2:
        model, opt = _fsdp2_model(seed=0)
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(comm.rank))
        model(x).square().sum().backward()
        opt.step()
        trained = _fsdp2_state_bytes(model, opt)
        state = _full_state(model, opt, cpu_offload=True)  # rank 0's, on the CPU (empty elsewhere)
        del model, opt
    ct.grow_group(1, timeout=60)
    try:
        dist.all_reduce(torch.zeros(1), group=before)
        stale = None
    except (RuntimeError, ValueError) as exc:
        stale = f"{type(exc).__name__}: {exc}"
    carried = _fsdp2_after_grow(state) if with_fsdp2 else None
    return _all_ranks_group_sum() + (stale, trained, carried)


def joiner_scale_up(with_fsdp2):
    _join_torch()
    carried = _fsdp2_after_grow(({}, {})) if with_fsdp2 else None
    return _all_ranks_group_sum() + (None, None, carried)


# -- a group from new_group grows; the default group and the others stay -----------------------------
def case_grow_subgroup(comm, port):
    """3 ranks; ranks 0 and 2 form a new_group and grow it by a joiner (rank 1 takes no part);
    then the grown group, the untouched default group and another group made before the grow work.
    Returns (the grown group's size and sum of group ranks, the joiner's global rank as torch maps
    it, the default group's sum, the other group's sum, what the old group says)."""
    import torch.distributed as dist

    import commlib.torch as ct
    _init_torch(comm, port)
    sub = dist.new_group([0, 2])
    other = dist.new_group([1, 2])
    if comm.rank == 0:
        TCPStore("127.0.0.1", port).set("subgroup_name", dist.distributed_c10d._get_process_group_name(sub))
    grown = None
    if comm.rank in (0, 2):
        grown = ct.grow_group(1, group=sub, timeout=60)
    out = [None, None]
    if grown is not None:
        x = torch.tensor([dist.get_rank(grown)], dtype=torch.int64)
        dist.all_reduce(x, group=grown)
        out = [(dist.get_world_size(grown), int(x.item()), grown.group_desc),
               [dist.get_global_rank(grown, r) for r in (0, 1)]]
    world = torch.tensor([comm.rank], dtype=torch.int64)
    dist.all_reduce(world)
    pair = torch.tensor([comm.rank], dtype=torch.int64)
    if comm.rank in (1, 2):
        dist.all_reduce(pair, group=other)
    stale = None
    if grown is not None:
        try:
            dist.all_reduce(torch.zeros(1), group=sub)
        except (RuntimeError, ValueError) as exc:
            stale = type(exc).__name__
    dist.barrier()
    dist.destroy_process_group()
    return tuple(out) + (int(world.item()), int(pair.item()), stale)


def joiner_subgroup():
    """Joins the members' new_group (its name from rank 0): that grown group is its world."""
    import torch.distributed as dist
    pool_store = TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]))
    name = bytes(pool_store.get("subgroup_name")).decode()
    pool_store.close()
    _join_torch(group_name=name)
    x = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(x)
    out = (dist.get_world_size(), int(x.item()), dist.get_rank())
    dist.destroy_process_group()
    return out
