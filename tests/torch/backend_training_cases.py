"""Rank-side cases of the torch backend: DDP against single-process training, FSDP2/HSDP, DTensor
and functional collectives against the same over gloo (set-up and tolerances: backend_cases.py)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from backend_cases import DDP_ATOL, DDP_RTOL, FSDP_ATOL, FSDP_RTOL, _batch, _cmp, _data, _mesh, setup


# -- DDP ------------------------------------------------------------------------------------------
def _mlp(seed, unused=False):
    torch.manual_seed(seed)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 16)
            self.b = torch.nn.Linear(16, 4)
            self.unused = torch.nn.Linear(16, 4) if unused else None

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))
    return M()


def case_ddp(comm, variant, steps=20, per_rank=4):
    """DDP on "commlib" vs single-process full-batch training; returns flat params (bytes)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    setup(comm)
    P, r = comm.size, comm.rank
    model = _mlp(0, unused=variant == "find_unused")
    ref = _mlp(0, unused=variant == "find_unused")
    ddp = DDP(model, find_unused_parameters=variant == "find_unused")
    if variant == "hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):  # allreduce_hook, written out: sum then divide in a .then
            t = bucket.buffer()
            fut = dist.all_reduce(t, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0].div_(P))
        ddp.register_comm_hook(None, hook)
        del default_hooks
    if variant == "powersgd":  # its callbacks issue and wait on collectives: must not deadlock
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, use_error_feedback=True)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    micro = 2 if variant == "no_sync" else 1
    for step in range(steps):
        x, y = _batch(step, per_rank * P * micro)
        # reference: full batch
        ropt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ropt.step()
        # DDP: this rank's shard (for no_sync: two micro-batches, the first without sync)
        opt.zero_grad()
        xs = x.view(micro, P, per_rank, 8)
        ys = y.view(micro, P, per_rank, 4)
        for m in range(micro):
            xm, ym = xs[m, r], ys[m, r]
            if m < micro - 1:
                with ddp.no_sync():
                    (torch.nn.functional.mse_loss(ddp(xm), ym) / micro).backward()
            else:
                (torch.nn.functional.mse_loss(ddp(xm), ym) / micro).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if variant == "powersgd":  # lossy compression: only bitwise agreement across ranks
            break
        if not torch.allclose(p, q, rtol=DDP_RTOL, atol=DDP_ATOL):
            raise AssertionError(f"DDP {variant}: {name} differs from full-batch training by "
                                 f"{(p - q).abs().max().item():.3g}")
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()


# -- FSDP2 / HSDP -----------------------------------------------------------------------------------
def _fsdp_losses(mesh, steps, hsdp):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    r = dist.get_rank()
    losses = []
    for step in range(steps):
        x, y = _batch(1000 * step + r, 4)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    return losses, full


def case_fsdp(comm, shape, steps=10):
    """FSDP2 (1-D mesh) or HSDP (2-D mesh) over commlib vs the same over gloo."""
    st = setup(comm)
    shape = tuple(shape)
    hsdp = len(shape) == 2
    l1, p1 = _fsdp_losses(_mesh(st, "commlib", shape), steps, hsdp)
    l2, p2 = _fsdp_losses(_mesh(st, "gloo", shape), steps, hsdp)
    a, b = torch.tensor(l1), torch.tensor(l2)
    if not torch.allclose(a, b, rtol=FSDP_RTOL, atol=FSDP_ATOL):
        raise AssertionError(f"FSDP {shape}: losses commlib {l1} vs gloo {l2}")
    for x, y in zip(p1, p2):
        if not torch.allclose(x, y, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"FSDP {shape}: parameters differ by {(x - y).abs().max()}")
    return l1


# -- DTensor and functional collectives -------------------------------------------------------------
def case_dtensor(comm):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    st = setup(comm)
    P, r = comm.size, comm.rank
    meshes = {k: _mesh(st, k, (P,)) for k in ("commlib", "gloo")}
    results = {}
    for k, mesh in meshes.items():
        out = []
        g = torch.Generator().manual_seed(5)
        full = torch.randn(2 * P + 1, 3, generator=g)
        d = distribute_tensor(full, mesh, [Shard(0)])
        out.append(d.to_local().clone())
        rep = d.redistribute(mesh, [Replicate()])
        out.append(rep.to_local().clone())
        sh1 = rep.redistribute(mesh, [Shard(1)])
        out.append(sh1.to_local().clone())
        out.append(sh1.redistribute(mesh, [Shard(0)]).to_local().clone())
        local = torch.arange(12, dtype=torch.float32).view(4, 3) * (r + 1)
        part = DTensor.from_local(local, mesh, [Partial()])
        out.append(part.redistribute(mesh, [Replicate()]).to_local().clone())
        out.append(part.redistribute(mesh, [Shard(0)]).to_local().clone())
        part_avg = DTensor.from_local(local, mesh, [Partial("avg")])
        out.append(part_avg.redistribute(mesh, [Replicate()]).to_local().clone())
        out.append(full.shape == rep.to_local().shape)
        results[k] = out
    for i, (a, b) in enumerate(zip(results["commlib"], results["gloo"])):
        if isinstance(a, torch.Tensor):
            _cmp(f"dtensor step {i}", a, b, exact=False)
        else:
            assert a == b
    return True


def case_funcol(comm):
    import warnings
    import torch.distributed._functional_collectives as fc
    warnings.filterwarnings("ignore", category=FutureWarning)
    st = setup(comm)
    P, r = comm.size, comm.rank
    groups = {"commlib": st["world"], "gloo": st["gloo"]}
    res = {}
    for k, g in groups.items():
        out = []
        x = _data((P * 2, 3), torch.int64, r, 200)
        out.append(fc.wait_tensor(fc.all_reduce(x, "sum", g)))
        out.append(fc.wait_tensor(fc.all_reduce(x, "max", g)))
        out.append(fc.wait_tensor(fc.all_gather_tensor(x, 0, g)))
        out.append(fc.wait_tensor(fc.all_gather_tensor(x, 1, g)))
        out.append(fc.wait_tensor(fc.reduce_scatter_tensor(x, "sum", 0, g)))
        out.append(fc.wait_tensor(fc.all_to_all_single(x, None, None, g)))
        sp = [(r + j) % 2 + 1 for j in range(P)]
        osp = [(j + r) % 2 + 1 for j in range(P)]
        y = _data((sum(sp), 3), torch.int64, r, 201)
        out.append(fc.wait_tensor(fc.all_to_all_single(y, osp, sp, g)))
        out.append(fc.wait_tensor(fc.broadcast(x, P - 1, g)))
        out.extend(fc.wait_tensor(t) for t in fc.all_reduce_coalesced([x, x * 2], "sum", g))
        out.extend(fc.wait_tensor(t) for t in fc.all_gather_into_tensor_coalesced([x, x + 1], g))
        out.extend(fc.wait_tensor(t) for t in fc.reduce_scatter_tensor_coalesced(
            [x, x + 1], "sum", [0, 0], g))
        xf = _data((P * 2,), torch.float32, r, 202)
        out.append(fc.wait_tensor(fc.all_reduce(xf, "avg", g)) if k == "commlib"
                   else fc.wait_tensor(fc.all_reduce(xf, "sum", g)) / P)
        res[k] = out
    for i, (a, b) in enumerate(zip(res["commlib"], res["gloo"])):
        _cmp(f"functional collective #{i}", a, b, exact=not a.is_floating_point())
    return len(res["commlib"])


# -- torch's pipelining ------------------------------------------------------------------------------
def case_torch_pipeline(comm, steps=2, n_micro=3):
    """torch.distributed.pipelining's GPipe over two stages (one per rank) on the commlib group and on
    the gloo twin, in the same processes: its stage-to-stage sends and receives (shape inference's
    object sends too) go through the backend's batch_isend_irecv. The last stage's losses equal
    single-process training's per micro-batch, and every stage's gradients and parameters after
    `steps` SGD steps equal gloo's exactly (float64). Returns the number of values compared."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    st = setup(comm)
    r = comm.rank
    assert comm.size == 2, "two stages, one per rank"
    loss_fn = torch.nn.functional.mse_loss
    ref = _mlp(0).double()
    x_all, y_all = (t.double() for t in _batch(0, 4 * n_micro))
    want = [loss_fn(ref(x), y).item() for x, y in zip(x_all.chunk(n_micro), y_all.chunk(n_micro))]
    seen = {}
    for name in ("world", "gloo"):
        whole = _mlp(0).double()
        part = torch.nn.Sequential(whole.a, torch.nn.Tanh()) if r == 0 else whole.b
        stage = PipelineStage(part, r, 2, torch.device("cpu"), group=st[name])
        sched = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=loss_fn)
        opt = torch.optim.SGD(part.parameters(), lr=0.1)
        got = []
        for step in range(steps):
            x, y = (t.double() for t in _batch(step, 4 * n_micro))
            opt.zero_grad()
            losses = []
            sched.step(x) if r == 0 else sched.step(target=y, losses=losses)
            got.append([loss.item() for loss in losses])
            grads = [p.grad.clone() for p in part.parameters()]
            opt.step()
        if r == 1:
            _cmp(f"{name}: first step's losses", torch.tensor(got[0]), torch.tensor(want), exact=False)
        seen[name] = (got, grads, [p.detach().clone() for p in part.parameters()])
    assert seen["world"][0] == seen["gloo"][0], (seen["world"][0], seen["gloo"][0])
    n = 0
    for a, b in zip(seen["world"][1] + seen["world"][2], seen["gloo"][1] + seen["gloo"][2]):
        assert torch.equal(a, b), f"commlib {a.flatten()[:4].tolist()} != gloo {b.flatten()[:4].tolist()}"
        n += a.numel()
    return n
