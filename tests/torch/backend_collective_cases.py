"""Rank-side cases of the torch backend: every dist.* call over commlib against the same over gloo
(set-up, tolerances and data: backend_cases.py)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from backend_cases import _cmp, _data, setup


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
