"""Rank side of test_torch_native_calls.py's calls moved from the Python group in session 26 (docs/
torch_backend.md, "What still reaches the Python group"): PREMUL_SUM on the integer dtypes the core
reduces (int8, uint8, int32, int64), a non-root's list in gather and scatter (ignored), and
reduce_scatter_tensor_coalesced over several dtypes (one core call per dtype). Each runs
on the C++ backend with a spy on its Python group (``handed_over``: it must see none), and again on
a group of the Python backend alone (``python_world``), and both equal the exact expected values."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from backend_cases import setup
from native_call_cases import handed_over
from torch_fast_path_cases import python_world

INTEGERS = (torch.int8, torch.uint8, torch.int32, torch.int64)


def _premul_calls(P, r):
    """{name: (call(group) -> the tensor it wrote, expected)}: PREMUL_SUM with an integer factor
    (float and 0-d tensor forms) on each integer dtype; values small enough for int8 at 3 ranks."""
    calls = {}
    for dt in INTEGERS:
        for factor in (3.0, torch.tensor(2.0, dtype=torch.float64)):
            f = float(factor)
            op = dist._make_nccl_premul_sum(factor)
            x = lambda n, dt=dt: (torch.arange(n) % 3 + r).to(dt)  # noqa: E731
            total = lambda n, dt=dt, f=f: (f * sum((torch.arange(n) % 3 + q) for q in range(P))).to(dt)  # noqa: E731
            kind = "tensor" if isinstance(factor, torch.Tensor) else "float"

            def all_reduce(g, x=x, op=op):
                t = x(7)
                g.allreduce([t], _opts("AllreduceOptions", reduceOp=op)).wait()
                return t

            def reduce(g, x=x, op=op):
                t = x(5)
                g.reduce([t], _opts("ReduceOptions", reduceOp=op, rootRank=P - 1)).wait()
                return t if r == P - 1 else None

            def reduce_scatter(g, x=x, op=op, dt=dt):
                out = torch.zeros(2, dtype=dt)
                g._reduce_scatter_base(out, x(2 * P), _opts("ReduceScatterOptions", reduceOp=op)).wait()
                return out
            calls[f"all_reduce premul_sum {kind} {dt}"] = (all_reduce, total(7))
            calls[f"reduce premul_sum {kind} {dt}"] = (reduce, total(5) if r == P - 1 else None)
            calls[f"reduce_scatter_tensor premul_sum {kind} {dt}"] = (reduce_scatter, total(2 * P)[2 * r:2 * r + 2])
    return calls


def _rooted_calls(P, r):
    """gather and scatter where every rank passes a list (the root's is used, the others' ignored)."""
    def gather(g):
        lst = [torch.full((3,), -1, dtype=torch.int64) for _ in range(P)]
        g.gather([lst], [torch.full((3,), r + 1, dtype=torch.int64)], _opts("GatherOptions", rootRank=0)).wait()
        return torch.stack(lst)

    def scatter(g):
        out = torch.full((3,), -1, dtype=torch.int64)
        blocks = [torch.full((3,), 10 * (r + 1) + q, dtype=torch.int64) for q in range(P)]
        g.scatter([out], [blocks], _opts("ScatterOptions", rootRank=P - 1)).wait()
        return out
    untouched = torch.full((P, 3), -1, dtype=torch.int64)
    gathered = torch.stack([torch.full((3,), q + 1, dtype=torch.int64) for q in range(P)])
    return {"gather, a list on every rank": (gather, gathered if r == 0 else untouched),
            "scatter, a list on every rank": (scatter, torch.full((3,), 10 * P + r, dtype=torch.int64))}


def _mixed_dtype_calls(P, r):
    """reduce_scatter_tensor_coalesced over pairs of three dtypes (float32, int64, float32 again, and
    an int8 one): one core call per dtype from C++; blocking and asynchronous."""
    dts = (torch.float32, torch.int64, torch.float32, torch.int8)
    sizes = (3, 2, 5, 1)

    def mine(i, q):  # rank q's input of pair i: P blocks of sizes[i]
        return (torch.arange(P * sizes[i]) % 4 + q + i).to(dts[i])

    def call(g, asynchronous):
        outs = [torch.zeros(n, dtype=dt) for n, dt in zip(sizes, dts)]
        ins = [mine(i, r) for i in range(len(dts))]
        g.reduce_scatter_tensor_coalesced(outs, ins, _opts("ReduceScatterOptions", asyncOp=asynchronous)).wait()
        return torch.cat([o.double() for o in outs])
    want = torch.cat([sum(mine(i, q) for q in range(P))[r * n:(r + 1) * n].double() for i, n in enumerate(sizes)])
    return {"reduce_scatter_tensor_coalesced of three dtypes": (lambda g: call(g, False), want),
            "reduce_scatter_tensor_coalesced of three dtypes, async": (lambda g: call(g, True), want)}


def _opts(kind, **fields):
    """Blocking options (torch's default is asynchronous) with ``fields`` set."""
    o = getattr(_c10d, kind)()
    o.asyncOp = False
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def case_moved_calls(comm):
    """True when every call above equals its expected value on both groups and the C++ backend
    handed none over; else an AssertionError naming the call."""
    setup(comm)
    P, r = comm.size, comm.rank
    with python_world(comm):
        pyg = dist.distributed_c10d._get_default_group()
    world = dist.group.WORLD
    calls = dict(_premul_calls(P, r), **_rooted_calls(P, r), **_mixed_dtype_calls(P, r))
    for name, (call, expected) in calls.items():
        with handed_over(world) as seen:
            got = call(world)
        python_alone = call(pyg)
        assert seen == [], (r, name, "handed over", seen)
        for who, value in (("Python", python_alone), ("C++", got)):
            assert (value is None and expected is None) or (
                value is not None and expected is not None and value.dtype == expected.dtype
                and torch.equal(value, expected)), (r, name, who, value, expected)
    return True
