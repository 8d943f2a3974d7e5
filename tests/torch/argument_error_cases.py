"""Rank side of tests/torch/test_argument_errors.py (issue #44 item 3): every call with a bad argument
the C++ backend (commlib._C_torch) once handed to the Python backend so that it named the argument.

Each bad call runs twice in the same processes: on the default group's C++ backend, under
``handed_over`` (a spy on every method of its Python group), and on a group of the Python backend
alone (``python_world``'s: the messages of record, which tests elsewhere pin). For each the C++
backend must raise the same class with the same text, and hand nothing over. Every rank makes the
same bad calls (each raises on every rank before anything is sent), then an all_reduce that is
right only if nothing of the bad calls was sent."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

import commlib.torch
from backend_cases import setup
from native_call_cases import handed_over
from spies import spy_methods
from torch_fast_path_cases import python_world


def _opts(kind, **fields):
    o = getattr(_c10d, kind)()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def bad_calls(P, r):
    """{name: call(group)}: one call per bad argument on CPU tensors, the same on every rank, through
    the group's methods (torch's dispatcher ops, as torch's own API reaches the backend)."""
    f, i64 = torch.float32, torch.int64
    z = lambda n, dt=f: torch.zeros(n, dtype=dt)  # noqa: E731
    meta = lambda n: torch.zeros(n, device="meta")  # noqa: E731
    band, bxor = dist.ReduceOp.BAND, dist.ReduceOp.BXOR
    uneven_own = [z(2) for _ in range(P)]
    uneven_own[r] = z(3)
    wrong_dtype = [z(2) for _ in range(P)]
    wrong_dtype[(r + 1) % P] = z(2, i64)
    return {
        # roots out of range
        "broadcast root": lambda b: b.broadcast([z(3)], _opts("BroadcastOptions", rootRank=P)),
        "reduce root": lambda b: b.reduce([z(3)], _opts("ReduceOptions", rootRank=P)),
        "reduce negative root": lambda b: b.reduce([z(3)], _opts("ReduceOptions", rootRank=-1)),
        "gather root": lambda b: b.gather([], [z(2)], _opts("GatherOptions", rootRank=P)),
        "scatter root": lambda b: b.scatter([z(2)], [], _opts("ScatterOptions", rootRank=P)),
        # bitwise ops on floats
        "all_reduce band float32": lambda b: b.allreduce([z(4)], _opts("AllreduceOptions", reduceOp=band)),
        "reduce bxor float64": lambda b: b.reduce([z(4, torch.float64)], _opts("ReduceOptions", reduceOp=bxor)),
        "reduce_scatter_tensor band": lambda b: b._reduce_scatter_base(
            z(2), z(2 * P), _opts("ReduceScatterOptions", reduceOp=band)),
        "reduce_scatter band": lambda b: b.reduce_scatter(
            [z(2)], [[z(2) for _ in range(P)]], _opts("ReduceScatterOptions", reduceOp=band)),
        "allreduce_coalesced band": lambda b: b.allreduce_coalesced(
            [z(2), z(3)], _opts("AllreduceCoalescedOptions", reduceOp=band)),
        # sizes and dtypes of the single-tensor forms
        "all_gather_into_tensor size": lambda b: b._allgather_base(z(2 * P + 1), z(2), _c10d.AllgatherOptions()),
        "all_gather_into_tensor dtype": lambda b: b._allgather_base(z(2 * P, i64), z(2), _c10d.AllgatherOptions()),
        "reduce_scatter_tensor size": lambda b: b._reduce_scatter_base(z(2), z(2 * P + 1),
                                                                        dist.ReduceScatterOptions()),
        "reduce_scatter_tensor dtype": lambda b: b._reduce_scatter_base(z(2), z(2 * P, i64),
                                                                         dist.ReduceScatterOptions()),
        "all_to_all_single dtype": lambda b: b.alltoall_base(z(2 * P), z(2 * P, i64), [], [],
                                                             dist.AllToAllOptions()),
        "all_to_all_single input split": lambda b: b.alltoall_base(z(P), z(P + 1), [], [], dist.AllToAllOptions()),
        "all_to_all_single output split": lambda b: b.alltoall_base(z(P + 1), z(P), [], [], dist.AllToAllOptions()),
        # lists
        "all_gather list length": lambda b: b.allgather([[z(2) for _ in range(P + 1)]], [z(2)],
                                                        _c10d.AllgatherOptions()),
        "all_gather list dtype": lambda b: b.allgather([wrong_dtype], [z(2)], _c10d.AllgatherOptions()),
        "all_gather list own size": lambda b: b.allgather([uneven_own], [z(2)], _c10d.AllgatherOptions()),
        "reduce_scatter list length": lambda b: b.reduce_scatter([z(2)], [[z(2) for _ in range(P + 1)]],
                                                                 dist.ReduceScatterOptions()),
        "reduce_scatter list own size": lambda b: b.reduce_scatter([z(2)], [uneven_own], dist.ReduceScatterOptions()),
        "all_to_all list length": lambda b: b.alltoall([z(2) for _ in range(P + 1)], [z(2) for _ in range(P + 1)],
                                                       dist.AllToAllOptions()),
        "all_to_all list dtype": lambda b: b.alltoall([z(2) for _ in range(P)], wrong_dtype, dist.AllToAllOptions()),
        # the coalesced forms
        "allgather_into_tensor_coalesced size": lambda b: b.allgather_into_tensor_coalesced(
            [z(2 * P), z(3 * P + 1)], [z(2), z(3)], _c10d.AllgatherOptions()),
        "reduce_scatter_tensor_coalesced size": lambda b: b.reduce_scatter_tensor_coalesced(
            [z(2), z(3)], [z(2 * P), z(3 * P + 1)], dist.ReduceScatterOptions()),
        # lists of two lengths (once cut to the shorter: the pairs past it silently dropped)
        "allgather_into_tensor_coalesced more outputs": lambda b: b.allgather_into_tensor_coalesced(
            [z(2 * P), z(3 * P)], [z(2)], _c10d.AllgatherOptions()),
        "allgather_into_tensor_coalesced more inputs": lambda b: b.allgather_into_tensor_coalesced(
            [z(2 * P)], [z(2), z(3)], _c10d.AllgatherOptions()),
        "reduce_scatter_tensor_coalesced more outputs": lambda b: b.reduce_scatter_tensor_coalesced(
            [z(2), z(3)], [z(2 * P)], dist.ReduceScatterOptions()),
        "reduce_scatter_tensor_coalesced more inputs": lambda b: b.reduce_scatter_tensor_coalesced(
            [z(2)], [z(2 * P), z(3 * P)], dist.ReduceScatterOptions()),
        "reduce_scatter_tensor_coalesced lengths before a bad op": lambda b: b.reduce_scatter_tensor_coalesced(
            [z(2)], [z(2 * P), z(3 * P)], _opts("ReduceScatterOptions", reduceOp=band)),
        "reduce_scatter two input lists": lambda b: b.reduce_scatter(
            [z(2)], [[z(2) for _ in range(P)], [z(2) for _ in range(P)]], dist.ReduceScatterOptions()),
        "reduce_scatter no input list": lambda b: b.reduce_scatter([z(2)], [], dist.ReduceScatterOptions()),
        "allgather_coalesced lists": lambda b: b.allgather_coalesced(
            [[z(2)] for _ in range(P + 1)], [z(2)], _c10d.AllgatherOptions()),
        "allgather_coalesced list length": lambda b: b.allgather_coalesced(
            [[z(2), z(2)] for _ in range(P)], [z(2)], _c10d.AllgatherOptions()),
        "allreduce_coalesced band, a later dtype": lambda b: b.allreduce_coalesced(
            [z(2, i64), z(3)], _opts("AllreduceCoalescedOptions", reduceOp=band)),
        "all_reduce max complex": lambda b: b.allreduce([z(2, torch.complex64)],
                                                        _opts("AllreduceOptions", reduceOp=dist.ReduceOp.MAX)),
        "reduce premul_sum bool": lambda b: b.reduce([z(2, torch.bool)], _opts(
            "ReduceOptions", reduceOp=dist._make_nccl_premul_sum(2.0), rootRank=0)),
        "reduce_scatter list dtype": lambda b: b.reduce_scatter([z(2)], [[z(2, i64) for _ in range(P)]],
                                                                dist.ReduceScatterOptions()),
        # the root's list (the other ranks give two tensors of their own: each rank raises at once)
        "gather list length": lambda b: b.gather([[z(2) for _ in range(P + 1)]] if r == 0 else [],
                                                 [z(2)] if r == 0 else [z(2), z(2)], _opts("GatherOptions")),
        "gather list size": lambda b: b.gather([uneven_own] if r == 0 else [],
                                               [z(2)] if r == 0 else [z(2), z(2)], _opts("GatherOptions")),
        "scatter list length": lambda b: b.scatter([z(2)] if r == 0 else [z(2), z(2)],
                                                   [[z(2) for _ in range(P - 1)]] if r == 0 else [],
                                                   _opts("ScatterOptions")),
        "scatter list dtype": lambda b: b.scatter([z(2)] if r == 0 else [z(2), z(2)],
                                                  [wrong_dtype] if r == 0 else [], _opts("ScatterOptions")),
        # tensors on two devices (a meta tensor: the C++ backend declines it as it declines a CPU tensor
        # in a CUDA call's list)
        "all_gather list devices": lambda b: b.allgather([[z(2) for _ in range(P - 1)] + [meta(2)]], [z(2)],
                                                         _c10d.AllgatherOptions()),
        "allgather_coalesced devices": lambda b: b.allgather_coalesced(
            [[z(2)] for _ in range(P - 1)] + [[meta(2)]], [z(2)], _c10d.AllgatherOptions()),
        "reduce_scatter list devices": lambda b: b.reduce_scatter([z(2)], [[z(2) for _ in range(P - 1)] + [meta(2)]],
                                                                  dist.ReduceScatterOptions()),
        # several tensors where one is taken
        "gather several inputs": lambda b: b.gather([], [z(2), z(2)], _opts("GatherOptions", rootRank=0)),
        "scatter several outputs": lambda b: b.scatter([z(2), z(2)], [], _opts("ScatterOptions", rootRank=0)),
    }


# The communicator's methods the Python backend sends through.
_COMM_CALLS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
               "barrier")


def sent(group):
    """The names of the communicator calls the Python backend of ``group`` issued inside (those
    that returned: a call its own checks refused sent nothing)."""
    return spy_methods(commlib.torch.python_group(group).comm, _COMM_CALLS, returned_only=True)


def _outcome(call, group):
    try:
        call(group).wait()
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        return (type(e).__name__, str(e))
    return None


def case_argument_errors(comm):
    """{bad call: (C++ backend's (class, text), Python backend's, methods the C++ backend handed
    over, the Python backend's methods the other group reached, communicator calls that Python
    backend made before it raised)} on this rank, and whether an all_reduce after them all was
    right on both groups."""
    setup(comm)
    P, r = comm.size, comm.rank
    with python_world(comm):
        pyg = dist.distributed_c10d._get_default_group()
    world = dist.group.WORLD
    out = {}
    for name, call in bad_calls(P, r).items():
        with handed_over(world) as seen:
            got = _outcome(call, world)
        with handed_over(pyg) as reached, sent(pyg) as issued:
            expected = _outcome(call, pyg)
        out[name] = (got, expected, list(seen), list(reached), list(issued))
    right = []
    for g in (dist.group.WORLD, pyg):
        x = torch.full((5,), r + 1, dtype=torch.int64)
        dist.all_reduce(x, group=g)
        right.append(torch.equal(x, torch.full((5,), P * (P + 1) // 2, dtype=torch.int64)))
    return out, right
