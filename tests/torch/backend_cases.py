"""Rank-side cases for the torch backend tests (run by tests/ranks.py workers).

Each worker process initialises torch.distributed once with backend "commlib" (tcp:// rendezvous on
a port that rank 0 picks and shares through the pool's communicator) and also creates a gloo group
over the same ranks; every case runs an operation on both and compares. Everything heavy is cached
per process so the long-lived pool pays for it once.
"""
from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

_STATE: dict = {}

# tolerances: fp32 results of a reduction whose summation order differs from the reference
RTOL, ATOL = 1e-5, 1e-6
# DDP vs single-process full-batch training after 20 SGD steps (fp32)
DDP_RTOL, DDP_ATOL = 1e-4, 1e-5
# FSDP2/HSDP losses vs the same script over gloo (fp32)
FSDP_RTOL, FSDP_ATOL = 1e-5, 1e-6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(comm):
    """Initialise the default "commlib" group and a gloo twin once per process."""
    if "gloo" in _STATE:
        return _STATE
    import commlib.torch  # noqa: F401  (registers the backend)
    port = torch.tensor([_free_port() if comm.rank == 0 else 0], dtype=torch.int64)
    comm.broadcast(port, root=0)
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{int(port.item())}",
                            rank=comm.rank, world_size=comm.size,
                            timeout=datetime.timedelta(seconds=60))
    _STATE["gloo"] = dist.new_group(backend="gloo")
    _STATE["world"] = dist.group.WORLD
    return _STATE


# float16/bfloat16 partial results travel in their own precision between reduction steps (as in
# NCCL), so allow about one unit in the last place per step.
_HALF_RTOL = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _cmp(name, got, want, exact, steps=4):
    if exact or not got.is_floating_point():
        ok = torch.equal(got, want)
    elif got.dtype in _HALF_RTOL:
        ok = torch.allclose(got.double(), want.double(), rtol=_HALF_RTOL[got.dtype] * steps,
                            atol=1e-3)
    else:
        ok = torch.allclose(got.double(), want.double(), rtol=RTOL, atol=ATOL)
    if not ok:
        raise AssertionError(f"{name}: commlib {got.flatten()[:8].tolist()} != "
                             f"gloo {want.flatten()[:8].tolist()}")


def _data(shape, dtype, rank, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo, hi = (1, 4) if dtype in (torch.int8, torch.uint8) else (-50, 50)
    if dtype == torch.uint8:
        lo, hi = 0, 16
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


# -- dist.* against gloo -------------------------------------------------------------------------
_RED_OPS = {
    "sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR, "avg": dist.ReduceOp.AVG, "premul_sum": "premul",
}


def _torch_op(name, factor=0.25):
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(factor)
    return _RED_OPS[name]


def _gloo_reduce_ref(name, x, world, gloo, factor=0.25):
    """gloo's all_reduce, with AVG/PREMUL_SUM expressed as SUM (gloo lacks them)."""
    y = x.clone()
    if name == "premul_sum":
        y = y * factor
    op = dist.ReduceOp.SUM if name in ("avg", "premul_sum") else _RED_OPS[name]
    if y.dtype in (torch.float16, torch.bfloat16):
        y32 = y.float()
        dist.all_reduce(y32, op=op, group=gloo)
        y = y32
    else:
        dist.all_reduce(y, op=op, group=gloo)
    if name == "avg":
        y = y / world if y.is_floating_point() else torch.div(y, world, rounding_mode="floor")
    return y.to(x.dtype)


def case_allreduce(comm, dtypes=None, ops=None, shapes=((7,), (3, 5), (0,), (1,))):
    st = setup(comm)
    gloo, P = st["gloo"], comm.size
    dtypes = dtypes or ["float32", "float64", "int32", "int64", "uint8", "int8", "bfloat16",
                        "float16"]
    ops = ops or list(_RED_OPS)
    n = 0
    for dn in dtypes:
        dt = getattr(torch, dn)
        for opn in ops:
            if opn in ("band", "bor", "bxor") and dt.is_floating_point:
                continue
            if opn == "avg" and not dt.is_floating_point:
                continue
            if opn == "premul_sum" and not dt.is_floating_point:
                continue
            for shape in shapes:
                x = _data(shape, dt, comm.rank, salt=n)
                want = _gloo_reduce_ref(opn, x, P, gloo)
                got = x.clone()
                dist.all_reduce(got, op=_torch_op(opn))
                _cmp(f"all_reduce {dn} {opn} {shape}", got, want, exact=not dt.is_floating_point)
                # async + non-contiguous
                if len(shape) == 2 and shape[0] > 1:
                    base = x.clone().t()
                    w = dist.all_reduce(base, op=_torch_op(opn), async_op=True)
                    w.wait()
                    _cmp(f"all_reduce async non-contiguous {dn} {opn}", base, want.t(),
                         exact=not dt.is_floating_point)
                n += 1
    return n


def _g(t):
    """The tensor as gloo can move it (gloo lacks int16, and bool/complex in some calls: bytes)."""
    if t is None or t.dtype in (torch.int16, torch.uint16, torch.uint32, torch.bool,
                                torch.complex64, torch.complex128):
        return t if t is None else t.view(torch.uint8)
    return t


def case_collectives(comm):
    """Every data-movement and rooted call of dist.* against gloo."""
    st = setup(comm)
    gloo, P, r = st["gloo"], comm.size, comm.rank
    for dt in (torch.float32, torch.int64, torch.int16, torch.bool, torch.complex64):
        ex = True
        # broadcast from every root
        for root in range(P):
            x = _data((5, 3), dt, r, salt=root)
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src=root)
            dist.broadcast(_g(b), src=root, group=gloo)
            _cmp(f"broadcast {dt} root={root}", a, b, ex)
        # all_gather (list), all_gather_into_tensor
        x = _data((4,), dt, r, 1)
        outs = [torch.zeros(4, dtype=dt) for _ in range(P)]
        refs = [torch.zeros(4, dtype=dt) for _ in range(P)]
        dist.all_gather(outs, x)
        dist.all_gather([_g(t) for t in refs], _g(x), group=gloo)
        for i in range(P):
            _cmp(f"all_gather {dt}", outs[i], refs[i], ex)
        o1 = torch.zeros(P * 4, dtype=dt)
        o2 = torch.zeros(P * 4, dtype=dt)
        dist.all_gather_into_tensor(o1, x)
        dist.all_gather_into_tensor(_g(o2), _g(x), group=gloo)
        _cmp(f"all_gather_into_tensor {dt}", o1, o2, ex)
        o1 = torch.zeros(P, 4, dtype=dt)
        dist.all_gather_into_tensor(o1, x)  # stacked output
        _cmp(f"all_gather_into_tensor stacked {dt}", o1.view(-1), o2, ex)
        # all_to_all_single even, uneven; all_to_all lists
        x = _data((P * 2, 3), dt, r, 2)
        a, b = torch.zeros_like(x), torch.zeros_like(x)
        dist.all_to_all_single(a, x)
        dist.all_to_all_single(_g(b), _g(x), group=gloo)
        _cmp(f"all_to_all_single {dt}", a, b, ex)
        insp = [(r + j) % 3 for j in range(P)]            # rank r sends (r+j)%3 rows to j
        outsp = [(j + r) % 3 for j in range(P)]           # rank r receives (j+r)%3 rows from j
        x = _data((sum(insp), 2), dt, r, 3)
        a, b = torch.zeros(sum(outsp), 2, dtype=dt), torch.zeros(sum(outsp), 2, dtype=dt)
        dist.all_to_all_single(a, x, outsp, insp)
        dist.all_to_all_single(_g(b), _g(x), outsp, insp, group=gloo)
        _cmp(f"all_to_all_single uneven {dt}", a, b, ex)
        ins = [_data((2,), dt, r, 4 + j) for j in range(P)]
        outs = [torch.zeros(2, dtype=dt) for _ in range(P)]
        refs = [torch.zeros(2, dtype=dt) for _ in range(P)]
        dist.all_to_all(outs, ins)
        if True:
            dist.all_to_all([_g(t) for t in refs], [_g(t) for t in ins], group=gloo)
            for i in range(P):
                _cmp(f"all_to_all {dt}", outs[i], refs[i], ex)
        # uneven lists (gloo needs equal sizes): reference from a gloo all_gather
        ins = [_data((j + 1,), dt, r, 4 + j) for j in range(P)]
        outs = [torch.zeros(r + 1, dtype=dt) for _ in range(P)]
        dist.all_to_all(outs, ins)
        g = [torch.zeros(P * (P + 1) // 2, dtype=dt) for _ in range(P)]
        dist.all_gather([_g(t) for t in g], _g(torch.cat(ins)), group=gloo)
        off = r * (r + 1) // 2
        for j in range(P):
            _cmp(f"all_to_all uneven {dt}", outs[j], g[j][off:off + r + 1], ex)
        # gather / scatter from every root
        for root in range(P):
            x = _data((3,), dt, r, 10 + root)
            gl = [torch.zeros(3, dtype=dt) for _ in range(P)] if r == root else None
            gr = [torch.zeros(3, dtype=dt) for _ in range(P)] if r == root else None
            dist.gather(x, gl, dst=root)
            dist.gather(_g(x), [_g(t) for t in gr] if gr else None, dst=root, group=gloo)
            if r == root:
                for i in range(P):
                    _cmp(f"gather {dt} root={root}", gl[i], gr[i], ex)
            sl = [_data((2, 2), dt, root, 20 + j) for j in range(P)] if r == root else None
            a, b = torch.zeros(2, 2, dtype=dt), torch.zeros(2, 2, dtype=dt)
            dist.scatter(a, sl, src=root)
            dist.scatter(_g(b), [_g(t) for t in sl] if sl else None, src=root, group=gloo)
            _cmp(f"scatter {dt} root={root}", a, b, ex)
    # reduce, reduce_scatter, reduce_scatter_tensor over ops
    for dt in (torch.float32, torch.int32):
        for opn in ("sum", "max", "min", "prod", "bxor", "avg", "premul_sum"):
            if opn == "bxor" and dt.is_floating_point:
                continue
            if opn in ("avg", "premul_sum") and not dt.is_floating_point:
                continue
            ex = not dt.is_floating_point
            for root in range(P):
                x = _data((6,), dt, r, 30 + root)
                want = _gloo_reduce_ref(opn, x, P, gloo)
                a = x.clone()
                dist.reduce(a, dst=root, op=_torch_op(opn))
                if r == root:
                    _cmp(f"reduce {dt} {opn} root={root}", a, want, ex)
            x = _data((P * 3,), dt, r, 40)
            want = _gloo_reduce_ref(opn, x, P, gloo)[r * 3:(r + 1) * 3]
            a = torch.zeros(3, dtype=dt)
            dist.reduce_scatter_tensor(a, x, op=_torch_op(opn))
            _cmp(f"reduce_scatter_tensor {dt} {opn}", a, want, ex)
            a = torch.zeros(3, dtype=dt)
            dist.reduce_scatter(a, list(x.chunk(P)), op=_torch_op(opn))
            _cmp(f"reduce_scatter {dt} {opn}", a, want, ex)
    # reduce_scatter_tensor with a stacked (P, n) input; reduce_scatter uneven list
    x = _data((P, 4), torch.int64, r, 50)
    want = _gloo_reduce_ref("sum", x, P, gloo)[r]
    a = torch.zeros(4, dtype=torch.int64)
    dist.reduce_scatter_tensor(a, x)
    _cmp("reduce_scatter_tensor stacked", a, want, True)
    ins = [_data((j + 1,), torch.int64, r, 60 + j) for j in range(P)]
    a = torch.zeros(r + 1, dtype=torch.int64)
    dist.reduce_scatter(a, ins)
    full = _gloo_reduce_ref("sum", torch.cat(ins), P, gloo)
    off = r * (r + 1) // 2
    _cmp("reduce_scatter uneven", a, full[off:off + r + 1], True)
    # all_gather uneven sizes
    x = _data((r + 2,), torch.int32, r, 70)
    outs = [torch.zeros(j + 2, dtype=torch.int32) for j in range(P)]
    dist.all_gather(outs, x)
    for j in range(P):
        _cmp("all_gather uneven", outs[j], _data((j + 2,), torch.int32, j, 70), True)
    # non-contiguous tensors: broadcast, all_gather outputs, recv
    base = _data((4, 6), torch.float32, r, 75)
    a = base.clone().t()
    dist.broadcast(a, src=P - 1)
    _cmp("broadcast non-contiguous", a, _data((4, 6), torch.float32, P - 1, 75).t(), True)
    outs = [torch.zeros(4, 6).t() for _ in range(P)]
    dist.all_gather(outs, base.t())
    for j in range(P):
        _cmp("all_gather non-contiguous", outs[j], _data((4, 6), torch.float32, j, 75).t(), True)
    # barrier, send/recv ring, isend/irecv
    dist.barrier()
    dist.barrier(group=gloo)
    x = torch.arange(5, dtype=torch.float32) + r
    y = torch.zeros(5)
    if r % 2 == 0:
        dist.send(x, (r + 1) % P)
        dist.recv(y, (r - 1) % P)
    else:
        dist.recv(y, (r - 1) % P)
        dist.send(x, (r + 1) % P)
    _cmp("send/recv", y, torch.arange(5, dtype=torch.float32) + (r - 1) % P, True)
    if P > 1:
        y = torch.zeros(5)
        reqs = [dist.irecv(y, (r - 1) % P), dist.isend(x, (r + 1) % P)]
        for q in reqs:
            q.wait()
        _cmp("irecv/isend", y, torch.arange(5, dtype=torch.float32) + (r - 1) % P, True)
        # batch_isend_irecv in both directions, non-contiguous receive buffer
        ya, yb = torch.zeros(3, 2).t(), torch.zeros(4, dtype=torch.int64)
        ops = [dist.P2POp(dist.irecv, ya, (r - 1) % P), dist.P2POp(dist.irecv, yb, (r + 1) % P),
               dist.P2POp(dist.isend, torch.full((2, 3), float(r)), (r + 1) % P),
               dist.P2POp(dist.isend, torch.full((4,), r, dtype=torch.int64), (r - 1) % P)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        _cmp("batch_isend_irecv", ya, torch.full((2, 3), float((r - 1) % P)), True)
        _cmp("batch_isend_irecv int", yb, torch.full((4,), (r + 1) % P, dtype=torch.int64), True)
    # object collectives
    objs = [None] * P
    dist.all_gather_object(objs, {"rank": r, "s": "x" * r})
    assert objs == [{"rank": j, "s": "x" * j} for j in range(P)], objs
    lst = [f"hello {r}", r * 10] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == ["hello 0", 0], lst
    got = [None] * P if r == P - 1 else None
    dist.gather_object(("g", r), got, dst=P - 1)
    if r == P - 1:
        assert got == [("g", j) for j in range(P)], got
    out = [None]
    dist.scatter_object_list(out, [("s", j) for j in range(P)] if r == 0 else None, src=0)
    assert out == [("s", r)], out
    # PREMUL_SUM with a tensor factor; reductions of dtypes the core lacks (bool, int16, complex)
    x = torch.ones(4) * (r + 1)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(torch.tensor(0.5)))
    _cmp("premul_sum tensor factor", x, torch.full((4,), 0.25 * P * (P + 1)), True)
    b = torch.tensor([r == 0, True, False])
    dist.all_reduce(b)  # SUM on bool is logical or
    _cmp("all_reduce bool", b, torch.tensor([True, True, False]), True)
    b = torch.tensor([r == 0, True, False])
    dist.all_reduce(b, op=dist.ReduceOp.MIN)
    _cmp("all_reduce bool min", b, torch.tensor([P == 1, True, False]), True)
    x = torch.arange(6, dtype=torch.int16) * (r + 1)
    dist.all_reduce(x)
    _cmp("all_reduce int16", x, torch.arange(6, dtype=torch.int16) * (P * (P + 1) // 2), True)
    x = torch.complex(torch.ones(3) * r, torch.ones(3))
    dist.all_reduce(x)
    _cmp("all_reduce complex64", x, torch.complex(torch.ones(3) * (P * (P - 1) / 2),
                                                  torch.ones(3) * P), True)
    # async handles complete in order; futures carry the output tensors
    ts = [torch.full((1000,), float(r + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    order = []
    done = [f.then(lambda f, i=i: order.append(i)) for i, f in enumerate(futs)]
    torch.futures.wait_all(done)
    assert order == list(range(8)), f"async works completed out of order: {order}"
    vals = [f.wait() for f in futs]
    for i, (t, v) in enumerate(zip(ts, vals)):
        assert v[0] is t or torch.equal(v[0], t)
        _cmp("async all_reduce", t, torch.full((1000,), float(sum(range(P)) + P * i)), True)
    return True


def case_coalesced(comm):
    """Coalescing manager fast paths (all_reduce, all_gather_into_tensor, reduce_scatter_tensor)."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    st = setup(comm)
    gloo, P, r = st["gloo"], comm.size, comm.rank
    ts = [_data((3 + i,), torch.int64, r, 80 + i) for i in range(3)]
    refs = [t.clone() for t in ts]
    with _coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for t, ref in zip(ts, refs):
        dist.all_reduce(ref, group=gloo)
        _cmp("coalesced all_reduce", t, ref, True)
    ins = [_data((2 + i,), torch.int64, r, 90 + i) for i in range(3)]
    outs = [torch.zeros(P * (2 + i), dtype=torch.int64) for i in range(3)]
    with _coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    for o, i in zip(outs, ins):
        ref = torch.zeros_like(o)
        dist.all_gather_into_tensor(ref, i, group=gloo)
        _cmp("coalesced all_gather_into_tensor", o, ref, True)
    ins = [_data((P * (2 + i),), torch.int64, r, 95 + i) for i in range(3)]
    outs = [torch.zeros(2 + i, dtype=torch.int64) for i in range(3)]
    with _coalescing_manager():
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    for o, i in zip(outs, ins):
        ref = _gloo_reduce_ref("sum", i, P, gloo)[r * o.numel():(r + 1) * o.numel()]
        _cmp("coalesced reduce_scatter_tensor", o, ref, True)
    return True


def case_new_group(comm):
    """new_group over a subset; disjoint groups run concurrently; group ranks map correctly."""
    st = setup(comm)
    P, r = comm.size, comm.rank
    key = "subgroups"
    if key not in st:
        evens = list(range(0, P, 2))
        odds = list(range(1, P, 2))
        st[key] = (evens, odds, dist.new_group(evens), dist.new_group(odds) if odds else None)
    evens, odds, ge, go = st[key]
    mine, g = (evens, ge) if r % 2 == 0 else (odds, go)
    x = torch.tensor([float(r + 1)])
    dist.all_reduce(x, group=g)
    assert x.item() == sum(j + 1 for j in mine), (x, mine)
    y = torch.tensor([r * 7], dtype=torch.int64)
    dist.broadcast(y, src=mine[-1], group=g)
    assert y.item() == mine[-1] * 7
    outs = [torch.zeros(1, dtype=torch.int64) for _ in mine]
    dist.all_gather(outs, torch.tensor([r]), group=g)
    assert [o.item() for o in outs] == mine
    return dist.get_rank(g)


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


def _batch(step, n):
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


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
def _mesh(st, kind, shape):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    key = ("mesh", kind, shape)
    if key in st:
        return st[key]
    P = dist.get_world_size()
    if kind == "commlib":
        names = ("dp",) if len(shape) == 1 else ("replicate", "shard")
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    else:
        if len(shape) == 1:
            mesh = DeviceMesh.from_group(st["gloo"], "cpu", mesh_dim_names=("dp",))
        else:
            R, S = shape
            grid = torch.arange(P).view(R, S)
            shard_groups = [dist.new_group(grid[i].tolist(), backend="gloo") for i in range(R)]
            rep_groups = [dist.new_group(grid[:, j].tolist(), backend="gloo") for j in range(S)]
            r = dist.get_rank()
            i, j = r // S, r % S
            mesh = DeviceMesh.from_group([rep_groups[j], shard_groups[i]], "cpu", mesh=grid,
                                         mesh_dim_names=("replicate", "shard"))
    st[key] = mesh
    return mesh


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


# -- errors -----------------------------------------------------------------------------------------
def case_mismatch(comm):
    """A fresh commlib group; rank 0 all_reduces while the others broadcast: both must raise."""
    setup(comm)
    g = dist.new_group(backend="commlib")
    x = torch.ones(4)
    try:
        if comm.rank == 0:
            dist.all_reduce(x, group=g)
        else:
            dist.broadcast(x, src=0, group=g)
    except Exception as exc:  # noqa: BLE001
        msg = f"{type(exc).__name__}: {exc}"
    else:
        msg = None
    # asynchronous: the error comes through wait() / the future
    g2 = dist.new_group(backend="commlib")
    try:
        if comm.rank == 0:
            w = dist.all_reduce(torch.ones(3), group=g2, async_op=True)
        else:
            w = dist.all_gather_into_tensor(torch.ones(3 * comm.size), torch.ones(3), group=g2,
                                            async_op=True)
        w.wait()
    except Exception as exc:  # noqa: BLE001
        msg2 = f"{type(exc).__name__}: {exc}"
    else:
        msg2 = None
    return msg, msg2


def killed_rank_main(rank, size, port, result_path):
    """Entry point for a spawned process (not the pool): rank 1 dies after init."""
    import commlib.torch  # noqa: F401
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=5))
    x = torch.ones(8)
    dist.all_reduce(x)
    if rank == 1:
        os._exit(3)
    import time
    t0 = time.monotonic()
    try:
        for _ in range(3):
            dist.all_reduce(x)
            time.sleep(0.2)
        msg = "no error"
    except Exception as exc:  # noqa: BLE001
        msg = f"{type(exc).__name__}: {exc}"
    with open(result_path, "w") as f:
        f.write(f"{time.monotonic() - t0:.2f}\n{msg}")
    os._exit(0)


# -- options ----------------------------------------------------------------------------------------
def case_options(comm):
    """pg_options picks algorithms per collective; bad names are refused; the timeout is passed."""
    import commlib.torch as ct
    st = setup(comm)
    P, r = comm.size, comm.rank
    assert st["world"].comm.timeout == 60.0, st["world"].comm.timeout
    results = []
    for algo in ("ring", "recursive_doubling", "rabenseifner", "tree"):
        key = ("opt", algo)
        if key not in st:
            st[key] = dist.new_group(backend="commlib", pg_options=ct.Options(
                algorithms={"all_reduce": algo, "all_gather": "bruck", "broadcast": "pipeline"}))
        g = st[key]
        assert g.options.algorithms["all_reduce"] == algo
        x = torch.arange(10, dtype=torch.int64) * (r + 1)
        dist.all_reduce(x, group=g)
        assert torch.equal(x, torch.arange(10, dtype=torch.int64) * (P * (P + 1) // 2)), algo
        out = torch.zeros(3 * P, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.full((3,), r, dtype=torch.int64), group=g)
        assert torch.equal(out, torch.arange(P).repeat_interleave(3)), out
        y = torch.full((5,), r)
        dist.broadcast(y, src=P - 1, group=g)
        assert torch.equal(y, torch.full((5,), P - 1))
        results.append(algo)
    try:
        ct.Options(algorithms={"allreduce": "ring"})
    except ValueError as exc:
        assert "allreduce" in str(exc)
    else:
        raise AssertionError("unknown collective accepted")
    from commlib.torch.backend import _check_algorithms
    try:
        _check_algorithms(ct.Options(algorithms={"all_reduce": "nope"}))
    except ValueError as exc:
        assert "nope" in str(exc) and "ring" in str(exc)
    else:
        raise AssertionError("unknown algorithm accepted")
    return results
