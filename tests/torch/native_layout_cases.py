"""Rank side of test_torch_native_layouts.py: the layouts the Python group moved and the C++ backend
handed to it until session 27 (docs/torch_backend.md, "What still reaches the Python group"), none of
them an error: an expanded view (elements that overlap) as the input of all_to_all_single, the list
forms and a send; ``all_gather_coalesced`` whose ranks' blocks differ in size (padded); a
``reduce_scatter`` list that needs a cast (uneven blocks cast into the output's dtype, equal ones of
dtypes that promote to it). Each runs on the C++ backend with a spy on its Python group (it must see
none), on a group of the Python backend alone, and, where gloo takes the call, on gloo; all equal
the exact values every rank's data gives. An expanded *output* fails on both backends alike, after
the call ran (torch's own error from the copy back), and the group goes on working."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from backend_cases import setup
from native_call_cases import handed_over
from torch_fast_path_cases import python_world


def _rank_value(q, i=0):
    """What rank q contributes to block i (an expanded view of this one value)."""
    return 10 * q + i + 1


def _expanded(value, n, dtype=torch.int64):
    """A view of ``n`` elements all stored in one (stride 0): torch's expand."""
    return torch.tensor([value], dtype=dtype).expand(n)


def _input_calls(P, r):
    """{name: (call(group, async_op) -> what it wrote, expected, gloo takes it)}: each call reads an
    expanded input on every rank."""
    calls = {}

    def a2a_single(g, a, splits):
        out = torch.full((2 * P,), -1, dtype=torch.int64)
        w = dist.all_to_all_single(out, _expanded(_rank_value(r), 2 * P), splits, splits, group=g, async_op=a)
        if a:
            w.wait()
        return out
    want = torch.tensor([_rank_value(q) for q in range(P) for _ in range(2)])
    # (gloo refuses a non-contiguous all_to_all_single: "Tensors must be contiguous")
    calls["all_to_all_single, equal blocks"] = (lambda g, a: a2a_single(g, a, None), want, False)
    calls["all_to_all_single, split sizes"] = (lambda g, a: a2a_single(g, a, [2] * P), want, False)

    def all_gather(g, a):
        outs = [torch.full((3,), -1, dtype=torch.int64) for _ in range(P)]
        w = dist.all_gather(outs, _expanded(_rank_value(r), 3), group=g, async_op=a)
        if a:
            w.wait()
        return torch.stack(outs)
    calls["all_gather list"] = (all_gather, torch.tensor([[_rank_value(q)] * 3 for q in range(P)]), True)

    def all_gather_uneven(g, a):  # rank q's block has q + 2 elements
        outs = [torch.full((q + 2,), -1, dtype=torch.int64) for q in range(P)]
        w = dist.all_gather(outs, _expanded(_rank_value(r), r + 2), group=g, async_op=a)
        if a:
            w.wait()
        return torch.cat(outs)
    calls["all_gather uneven list"] = (
        all_gather_uneven, torch.cat([torch.full((q + 2,), _rank_value(q)) for q in range(P)]), False)

    def gather(g, a):
        outs = [torch.full((3,), -1, dtype=torch.int64) for _ in range(P)] if r == P - 1 else None
        w = dist.gather(_expanded(_rank_value(r), 3), outs, dst=P - 1, group=g, async_op=a)
        if a:
            w.wait()
        return torch.stack(outs) if outs is not None else torch.zeros(0)
    gathered = torch.tensor([[_rank_value(q)] * 3 for q in range(P)]) if r == P - 1 else torch.zeros(0)
    calls["gather"] = (gather, gathered, True)

    def scatter(g, a):
        out = torch.full((3,), -1, dtype=torch.int64)
        blocks = [_expanded(_rank_value(0, q), 3) for q in range(P)] if r == 0 else None
        w = dist.scatter(out, blocks, src=0, group=g, async_op=a)
        if a:
            w.wait()
        return out
    # (gloo scatters an expanded block's memory as it lies: one element and what follows it)
    calls["scatter"] = (scatter, torch.full((3,), _rank_value(0, r)), False)

    def all_to_all(g, a):
        outs = [torch.full((3,), -1, dtype=torch.int64) for _ in range(P)]
        w = dist.all_to_all(outs, [_expanded(_rank_value(r, q), 3) for q in range(P)], group=g, async_op=a)
        if a:
            w.wait()
        return torch.stack(outs)
    calls["all_to_all list"] = (all_to_all, torch.tensor([[_rank_value(q, r)] * 3 for q in range(P)]), True)

    def reduce_scatter(g, a):
        out = torch.full((3,), -1, dtype=torch.int64)
        w = dist.reduce_scatter(out, [_expanded(_rank_value(r, q), 3) for q in range(P)], group=g, async_op=a)
        if a:
            w.wait()
        return out
    calls["reduce_scatter list"] = (reduce_scatter, torch.full((3,), sum(_rank_value(q, r) for q in range(P))), True)

    def send_recv(g, a):
        got = torch.full((4,), -1, dtype=torch.int64)
        ops = [dist.P2POp(dist.isend, _expanded(_rank_value(r), 4), (r + 1) % P, group=g),
               dist.P2POp(dist.irecv, got, (r - 1) % P, group=g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return got
    # (gloo refuses it: "input tensor has to be contiguous")
    calls["send and recv"] = (send_recv, torch.full((4,), _rank_value((r - 1) % P)), False)
    return calls


def _reduce_scatter(g, out, ins, asynchronous, op=dist.ReduceOp.SUM):
    """The group's own reduce_scatter (torch's dist.reduce_scatter refuses dtypes that differ before
    any backend sees them; a caller of the group's method, as torch's own internals are, passes them)."""
    o = _c10d.ReduceScatterOptions()
    o.reduceOp = op
    o.asyncOp = asynchronous
    g.reduce_scatter([out], [ins], o).wait()


def _cast_calls(P, r):
    """reduce_scatter lists of other dtypes than the output's, and all_gather_coalesced of blocks
    that differ in size from rank to rank (gloo refuses both)."""
    calls = {}

    def uneven_cast(g, a):  # int32 blocks of q + 1 elements into an int16 output: cast (wrapping) first
        out = torch.full((r + 1,), -1, dtype=torch.int16)
        ins = [torch.full((q + 1,), 30000 + 5000 * r + q, dtype=torch.int32) for q in range(P)]
        _reduce_scatter(g, out, ins, a, dist.ReduceOp.MAX)
        return out
    # the MAX of the values wrapped to int16 (the Python side casts before it reduces: 35000 wraps
    # below 30000), not the int32 maximum wrapped after
    wrapped = torch.tensor([30000 + 5000 * q + r for q in range(P)], dtype=torch.int32).to(torch.int16)
    calls["reduce_scatter list, uneven int32 blocks into int16"] = (
        uneven_cast, wrapped.max().repeat(r + 1), False)

    def equal_promoted(g, a):  # int32 and int64 blocks promote to the int64 output
        out = torch.full((3,), -1, dtype=torch.int64)
        ins = [torch.full((3,), 2 ** 33 * (q % 2) + 7 * r + q, dtype=torch.int64 if q % 2 else torch.int32)
               for q in range(P)]
        _reduce_scatter(g, out, ins, a)
        return out
    calls["reduce_scatter list, int32 and int64 blocks into int64"] = (
        equal_promoted, torch.full((3,), sum(2 ** 33 * (r % 2) + 7 * q + r for q in range(P))), False)

    def bool_blocks(g, a):  # uint8 blocks of 1 + q % 2 elements into a bool output (SUM on bool: any)
        out = torch.zeros(1 + r % 2, dtype=torch.bool)
        ins = [torch.tensor([2 if r == 0 else 0, 0], dtype=torch.uint8)[:1 + q % 2] for q in range(P)]
        _reduce_scatter(g, out, ins, a)
        return out
    calls["reduce_scatter list, uint8 blocks into bool"] = (
        bool_blocks, torch.tensor([True, False][:1 + r % 2]), False)

    dts = (torch.float32, torch.int64, torch.int16)

    def coalesced_uneven(g, a):
        # input 0: rank q's block has q + 1 elements; input 1: equal; input 2: 3 - q % 2 elements
        n = (lambda q: q + 1, lambda q: 2, lambda q: 3 - q % 2)
        ins = [torch.full((n[i](r),), _rank_value(r, i), dtype=dts[i]) for i in range(3)]
        outs = [[torch.full((n[i](q),), -1, dtype=dts[i]) for i in range(3)] for q in range(P)]
        o = _c10d.AllgatherOptions()
        o.asyncOp = a
        g.allgather_coalesced(outs, ins, o).wait()  # (dist's wrapper refuses a mix of dtypes)
        return torch.cat([t.double() for per_rank in outs for t in per_rank])
    n = (lambda q: q + 1, lambda q: 2, lambda q: 3 - q % 2)
    calls["all_gather_coalesced, uneven blocks"] = (coalesced_uneven, torch.cat(
        [torch.full((n[i](q),), float(_rank_value(q, i)), dtype=torch.float64) for q in range(P) for i in range(3)]),
        False)
    return calls


def _equal(value, expected):
    return value.dtype == expected.dtype and value.shape == expected.shape and torch.equal(value, expected)


def case_layouts_run_in_cpp(comm):
    """True when every call above equals its expected value on the C++ backend (blocking and
    asynchronous) with nothing handed to the Python group, on the Python backend alone, and on gloo
    where gloo takes it; else an AssertionError naming the call."""
    st = setup(comm)
    P, r = comm.size, comm.rank
    with python_world(comm):
        pyg = dist.distributed_c10d._get_default_group()
    world, gloo = dist.group.WORLD, st["gloo"]
    calls = dict(_input_calls(P, r), **_cast_calls(P, r))
    for name, (call, expected, on_gloo) in calls.items():
        for asynchronous in (False, True):
            with handed_over(world) as seen:
                got = call(world, asynchronous)
            assert seen == [], (r, name, asynchronous, "handed over", seen)
            assert _equal(got, expected), (r, name, asynchronous, "C++", got, expected)
        python_alone = call(pyg, False)
        assert _equal(python_alone, expected), (r, name, "Python", python_alone, expected)
        if on_gloo:
            on = call(gloo, False)
            assert _equal(on, expected), (r, name, "gloo", on, expected)
    return True


def case_expanded_outputs_fail_alike(comm):
    """An expanded view as an output (all_to_all_single, all_gather list, a receive, all_reduce):
    the call runs on every rank and the copy back raises torch's own error, with the same class and
    text on the C++ backend (nothing handed over) as on the Python backend; a call after it works.
    Returns True, else an AssertionError naming the call."""
    setup(comm)
    P, r = comm.size, comm.rank
    with python_world(comm):
        pyg = dist.distributed_c10d._get_default_group()
    world = dist.group.WORLD

    def a2a(g):
        dist.all_to_all_single(torch.zeros(1, dtype=torch.int64).expand(P), torch.arange(P), group=g)

    def all_gather(g):
        dist.all_gather([torch.zeros(1).expand(2) for _ in range(P)], torch.ones(2), group=g)

    def recv(g):
        ops = [dist.P2POp(dist.isend, torch.ones(4), (r + 1) % P, group=g),
               dist.P2POp(dist.irecv, torch.zeros(1).expand(4), (r - 1) % P, group=g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    def all_reduce(g):
        dist.all_reduce(torch.ones(1).expand(3), group=g)

    def outcome(call, g):
        try:
            call(g)
        except Exception as e:  # noqa: BLE001 - the class and message are the result
            return type(e).__name__, str(e).split("\n")[0]
        return None
    for name, call in (("all_to_all_single", a2a), ("all_gather", all_gather), ("recv", recv),
                       ("all_reduce", all_reduce)):
        with handed_over(world) as seen:
            cpp = outcome(call, world)
        python = outcome(call, pyg)
        assert seen == [], (r, name, "handed over", seen)
        assert cpp is not None and cpp[0] == "RuntimeError" and "more than one element of the written-to tensor" in (
            cpp[1]), (r, name, cpp)
        assert python is not None and cpp[0] == python[0] and cpp[1].endswith(python[1]), (r, name, cpp, python)
        t = torch.full((2,), float(r))
        dist.all_reduce(t, group=world)  # the group goes on working
        assert torch.equal(t, torch.full((2,), float(sum(range(P))))), (r, name, t)
    return True
