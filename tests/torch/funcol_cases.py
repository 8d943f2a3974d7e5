"""Rank-side cases for torch's functional collectives over "commlib" (tests/torch/
test_functional_collectives.py), in the style of upstream's test_functional_api.py.

Every call runs twice in the same processes, once over a commlib group and once over a gloo group
of the same ranks given the same way (a ProcessGroup, a list of ranks with a tag, a 1-D DeviceMesh,
a dimension of a 2-D DeviceMesh), and the results must agree: integers exactly, floats within
backend_cases' tolerances (the reduction order differs from gloo's).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import backend_cases as bc

# the deprecated *_tensor aliases and the ranks+tag group form warn on every call
warnings.filterwarnings("ignore", category=FutureWarning)

DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16)
REDUCE_OPS = ("sum", "max", "min", "product")


def _groups(comm):
    """{form: (commlib group, gloo group)} for each way functional collectives accept a group,
    created once per process (every rank creates every group, in the same order)."""
    st = bc.setup(comm)
    if "funcol_groups" in st:
        return st["funcol_groups"]
    from torch.distributed.distributed_c10d import _new_group_with_tag
    P, r = comm.size, comm.rank
    ranks = list(range(P))
    forms = {"pg": (st["world"], st["gloo"])}
    # a list of ranks resolves to the first group over those ranks registered under the tag
    _new_group_with_tag(ranks, backend="commlib", pg_tag="fc_commlib")
    _new_group_with_tag(ranks, backend="gloo", pg_tag="fc_gloo")
    forms["ranks"] = ((ranks, "fc_commlib"), (ranks, "fc_gloo"))
    forms["mesh1d"] = (init_device_mesh("cpu", (P,), mesh_dim_names=("x",)),
                       DeviceMesh.from_group(st["gloo"], "cpu", mesh_dim_names=("x",)))
    # a (1, P) mesh: dimension 1 spans every rank, dimension 0 is each rank alone
    m2 = init_device_mesh("cpu", (1, P), mesh_dim_names=("a", "b"))
    singles = [dist.new_group([j], backend="gloo") for j in range(P)]
    g2 = DeviceMesh.from_group([singles[r], st["gloo"]], "cpu", mesh=torch.arange(P).view(1, P),
                               mesh_dim_names=("a", "b"))
    forms["mesh2d_dim1"] = ((m2, 1), (g2, 1))
    forms["mesh2d_dim0"] = ((m2, 0), (g2, 0))
    # each form must resolve to a group of the backend it stands for
    from torch.distributed.distributed_c10d import _resolve_process_group
    for form, pair in forms.items():
        for group, backend in zip(pair, ("commlib", "gloo")):
            if form == "ranks":
                name = fc._resolve_group(group[0], group[1])
            else:
                name = fc._resolve_group_name(group)
            got = dist.get_backend(_resolve_process_group(name))
            assert got == backend, f"{form}: resolved to a {got} group, expected {backend}"
    st["funcol_groups"] = forms
    return forms


def _call(fn, *args, group):
    """fn(*args, group) with a (ranks, tag) group passed as group=ranks, tag=tag."""
    if isinstance(group, tuple) and isinstance(group[0], list):
        return fn(*args, group[0], tag=group[1])
    return fn(*args, group)


def _size(group):
    if isinstance(group, tuple):
        g = group[0]
        return len(g) if isinstance(g, list) else g.size(group[1])
    return group.size()


def _results(comm, group, dtypes):
    """Every functional collective on `group`; a list of (name, plain tensor)."""
    r, n = comm.rank, _size(group)
    out = []

    def add(name, t, waited_early=False):
        # all_gather along dim != 0 must wait to concatenate the blocks (torch's own choice)
        if not waited_early:
            assert isinstance(t, fc.AsyncCollectiveTensor), f"{name}: {type(t).__name__} returned"
        out.append((name, fc.wait_tensor(t)))

    for dt in dtypes:
        x = bc._data((n * 2, 3), dt, r, salt=300)
        for op in REDUCE_OPS:
            if op == "product" and dt == torch.bfloat16:
                continue  # 2^-8 relative error per factor: the reference itself is noisy
            add(f"all_reduce {op} {dt}", _call(fc.all_reduce, x, op, group=group))
        for d in (0, 1):
            add(f"all_gather dim{d} {dt}", _call(fc.all_gather_tensor, x, d, group=group), d == 1)
        xr = bc._data((n * 2, n * 3), dt, r, salt=301)
        for d in (0, 1):
            add(f"reduce_scatter dim{d} {dt}",
                _call(fc.reduce_scatter_tensor, xr, "sum", d, group=group))
        add(f"all_to_all_single even {dt}",
            _call(fc.all_to_all_single, x, None, None, group=group))
        insp = [(r + j) % 3 for j in range(n)]    # this rank sends (r+j)%3 rows to rank j
        outsp = [(j + r) % 3 for j in range(n)]   # and receives (j+r)%3 rows from rank j
        y = bc._data((sum(insp), 2), dt, r, salt=302)
        add(f"all_to_all_single uneven {dt}",
            _call(fc.all_to_all_single, y, outsp, insp, group=group))
        for root in range(n):
            add(f"broadcast root={root} {dt}", _call(fc.broadcast, x, root, group=group))
        ins = [x, bc._data((5,), dt, r, salt=303)]
        for i, t in enumerate(_call(fc.all_reduce_coalesced, ins, "sum", group=group)):
            add(f"all_reduce_coalesced #{i} {dt}", t)
        for i, t in enumerate(_call(fc.all_gather_into_tensor_coalesced, ins, group=group)):
            add(f"all_gather_coalesced #{i} {dt}", t)
        for i, t in enumerate(_call(fc.reduce_scatter_tensor_coalesced, [x, xr], "sum", [0, 1],
                                    group=group)):
            add(f"reduce_scatter_coalesced #{i} {dt}", t)
        assert torch.equal(x, bc._data((n * 2, 3), dt, r, salt=300)), "input modified"
    return out


def _compare(what, got, want):
    assert [k for k, _ in got] == [k for k, _ in want]
    for (name, a), (_, b) in zip(got, want):
        bc._cmp(f"{what}: {name}", a, b, exact=False)  # exact for every non-float dtype
    return len(got)


def case_matrix(comm, forms, dtypes):
    """Every collective x dtype for each group form, commlib against gloo."""
    groups = _groups(comm)
    dts = [getattr(torch, d) for d in dtypes]
    n = 0
    for form in forms:
        mine, ref = groups[form]
        n += _compare(form, _results(comm, mine, dts), _results(comm, ref, dts))
    return n


def case_wait_semantics(comm):
    """AsyncCollectiveTensor waits on first use (not on views), wait() and wait_tensor give
    plain tensors, calls issued back to back complete in any wait order, the raw
    _c10d_functional ops (and the in-place all_reduce_) work with wait_tensor."""
    st = bc.setup(comm)
    P, r = comm.size, comm.rank
    g = st["world"]
    x = torch.arange(12, dtype=torch.int64).view(3, 4) * (r + 1)
    total = torch.arange(12, dtype=torch.int64).view(3, 4) * (P * (P + 1) // 2)
    a = fc.all_reduce(x, "sum", g)
    assert isinstance(a, fc.AsyncCollectiveTensor) and not a.completed
    v = a.view(-1)  # a view op does not wait
    assert isinstance(v, fc.AsyncCollectiveTensor) and not a.completed
    s = a + 0       # any other op waits, and returns a plain tensor
    assert a.completed and type(s) is torch.Tensor and torch.equal(s, total)
    assert torch.equal(v.wait(), total.view(-1))
    w = fc.all_reduce(x, "sum", g).wait()
    assert type(w) is torch.Tensor and torch.equal(w, total)
    # several in flight, waited in reverse order of issue
    pend = [fc.all_reduce(x * k, "sum", g) for k in range(1, 5)]
    pend.append(fc.all_gather_tensor(x, 0, g))
    gathered = fc.wait_tensor(pend.pop())
    assert torch.equal(gathered, torch.cat([x // (r + 1) * (j + 1) for j in range(P)]))
    for k in range(4, 0, -1):
        assert torch.equal(fc.wait_tensor(pend.pop()), total * k)
    assert torch.equal(torch.tensor(fc.all_reduce(x, "sum", g).tolist()), total)
    assert torch.equal(torch.from_numpy(fc.all_reduce(x, "max", g).numpy()), x // (r + 1) * P)
    # AVG (gloo has none): integer-valued floats, so the mean is exact
    xf = torch.arange(6, dtype=torch.float32) * (r + 1)
    assert torch.equal(fc.all_reduce(xf, "avg", g).wait(), torch.arange(6.0) * (P + 1) / 2)
    # permute_tensor (an all_to_all_single whose splits it counts in elements, so 1-D input):
    # rank j sends to rank j+1
    got = fc.permute_tensor(x.flatten(), [(j + 1) % P for j in range(P)], g).wait()
    assert torch.equal(got, (x // (r + 1) * ((r - 1) % P + 1)).flatten()), got
    # the raw ops, as torch.compile emits them
    ops = torch.ops._c10d_functional
    raw = ops.all_reduce(x, "sum", g.group_name)
    assert type(raw) is torch.Tensor
    assert torch.equal(ops.wait_tensor(raw), total)
    y = x.clone()
    ops.wait_tensor(ops.all_reduce_(y, "sum", g.group_name))
    assert torch.equal(y, total)
    raw = ops.all_gather_into_tensor(x, P, g.group_name)
    assert torch.equal(ops.wait_tensor(raw), gathered)
    return True


def _autograd_grads(comm, group, n):
    """Gradients through all_reduce, all_gather, reduce_scatter and uneven all_to_all."""
    r = comm.rank
    grads = []
    base = bc._data((n * 2, 3), torch.float64, r, salt=400)
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        x = base.clone().requires_grad_(True)
        if name == "all_reduce":
            y = fc.all_reduce(x, "sum", group)
        elif name == "all_gather":
            y = fc.all_gather_tensor_autograd(x, 1, group)
        elif name == "reduce_scatter":
            y = fc.reduce_scatter_tensor_autograd(x, "sum", 0, group)
        else:
            insp = [(r + j) % 3 for j in range(n)]
            outsp = [(j + r) % 3 for j in range(n)]
            x = bc._data((sum(insp), 3), torch.float64, r, 402).requires_grad_(True)
            y = fc.all_to_all_single_autograd(x, outsp, insp, group)
        y = fc.wait_tensor(y)
        assert y.requires_grad, name
        wy = bc._data(tuple(y.shape), torch.float64, r, salt=403)  # differs per rank
        (y * wy).sum().backward()
        grads.append((name, x.grad.clone()))
    return grads


def case_backward_of_an_async_call_many_times(comm, iters=200):
    """reduce_scatter's backward (an all_gather of the upstream gradient) `iters` times, exact.

    The forward's output is written by the backend's completion thread, possibly after autograd
    wrapped it; that copy must not be recorded by autograd (it used to be, in about one call in
    ten: the output's history was replaced and a rank sent a zero gradient)."""
    st = bc.setup(comm)
    n, r = comm.size, comm.rank
    want = torch.cat([torch.full((2, 3), float(j + 1), dtype=torch.float64) for j in range(n)])
    wrong = []
    for it in range(iters):
        x = torch.randn(n * 2, 3, dtype=torch.float64).requires_grad_(True)
        y = fc.wait_tensor(fc.reduce_scatter_tensor_autograd(x, "sum", 0, st["world"]))
        (y * float(r + 1)).sum().backward()
        if not torch.equal(x.grad, want):
            wrong.append((it, x.grad[:, 0].tolist()))
    assert not wrong, f"{len(wrong)} of {iters} gradients wrong, first {wrong[:3]}"
    return iters


def case_autograd(comm):
    """Backward of the autograd-enabled collectives, commlib against gloo (float64)."""
    st = bc.setup(comm)
    got = _autograd_grads(comm, st["world"], comm.size)
    want = _autograd_grads(comm, st["gloo"], comm.size)
    for (name, a), (_, b) in zip(got, want):
        bc._cmp(f"autograd {name}", a, b, exact=False)
    # all_reduce's backward is an all_reduce of the upstream gradients: check one directly
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    fc.wait_tensor(fc.all_reduce(x, "sum", st["world"])).mul(comm.rank + 1).sum().backward()
    assert torch.equal(x.grad, torch.full((4,), comm.size * (comm.size + 1) / 2,
                                          dtype=torch.float64)), x.grad
    return len(got)


def case_compiled(comm):
    """torch.compile(fullgraph=True, backend="aot_eager") of a function calling functional
    collectives (all_reduce, all_gather_tensor, reduce_scatter_tensor, all_to_all_single) on the
    commlib group: dynamo traces them into one graph (fullgraph: a graph break raises) and AOT
    autograd functionalizes them, without generating code (cheap). Returns the collective ops the
    graph holds and the number of frames compiled after two calls; the results equal the eager
    call's on commlib and on the gloo group exactly (integer-valued float64)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    st = bc.setup(comm)
    P, r = comm.size, comm.rank

    def make(group):
        def f(x):
            a = fc.all_reduce(x, "sum", group)
            g = fc.all_gather_tensor(a * 2, 0, group)
            s = fc.reduce_scatter_tensor(g, "sum", 0, group)
            t = fc.all_to_all_single(s + 1, None, None, group)
            return fc.wait_tensor(t) - a[: t.numel()]
        return f

    x = torch.arange(4.0 * P, dtype=torch.float64) + 100 * r
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(make(st["world"]), backend=counter, fullgraph=True)
    got = [compiled(x), compiled(x + 1)]
    for name in ("world", "gloo"):
        for a, b in zip(got, [make(st[name])(x), make(st[name])(x + 1)]):
            assert torch.equal(a, b), f"compiled {a.tolist()} != eager on {name} {b.tolist()}"
    ops = sorted({str(n.target).split("_c10d_functional.")[1].split(".")[0] for gm in counter.graphs
                  for n in gm.graph.nodes if n.op == "call_function" and "_c10d_functional." in str(n.target)})
    return ops, counter.frame_count
