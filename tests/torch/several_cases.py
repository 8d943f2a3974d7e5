"""Rank side of test_torch_several.py: torch's contract for a tensor list (commlib/torch/several.py,
csrc/torch_backend/several.cc) and sparse sends and receives, on both commlib backends against gloo.

Each call runs three times in the same processes: on gloo, on the default group (the C++ backend,
``commlib._C_torch``) and on a group of the Python backend alone (``python_world``'s group: what a
build without ``_C_torch`` runs). Results must equal gloo's exactly (integers); what gloo refuses
both backends refuse, naming the argument, before anything is sent (a ring of sends and receives
after the refusals still matches up). ``handed_over`` must see no Python method on the C++ backend.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from backend_cases import _data, setup
from native_call_cases import handed_over
from torch_fast_path_cases import python_world


def _groups(comm):
    """(name, group, the group's CPU backend: what a caller of backend methods reaches)."""
    st = setup(comm)
    with python_world(comm):  # (creates the Python-backend group once; we only keep it)
        pyg = dist.distributed_c10d._get_default_group()
    world = dist.group.WORLD
    return [(name, g, g._get_backend(torch.device("cpu")))
            for name, g in (("gloo", st["gloo"]), ("cpp", world), ("python", pyg))]


def _several(g, r, P):
    """Every several-tensor call torch's contract defines, on group ``g``: what each yields."""
    out = {}
    for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("product", dist.ReduceOp.PRODUCT)):
        a, b, c = (_data((5,), torch.int64, r, s) for s in (1, 2, 3))
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        g.allreduce([a, b, c], opts).wait()
        out[f"all_reduce {name}"] = torch.stack([a, b, c])
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = P - 1, 1
    a, b = _data((3, 2), torch.int32, r, 4), _data((3, 2), torch.int32, r, 5)
    g.broadcast([a, b], opts).wait()
    out["broadcast"] = torch.stack([a, b])
    ins = [_data((2,), torch.int64, r, 6), _data((2,), torch.int64, r, 7)]
    outs = [[torch.zeros(2, dtype=torch.int64) for _ in range(2 * P)] for _ in range(2)]
    g.allgather(outs, ins).wait()
    out["all_gather"] = torch.stack([torch.stack(o) for o in outs])
    return out


def _refusals(g, backend, r, P):
    """Several tensors where gloo takes one, and sparse sends and receives: what each raises."""
    x = [torch.zeros(2), torch.zeros(2)]
    sp = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,), check_invariants=True)
    calls = {
        "reduce": lambda: g.reduce(x, dist.ReduceOptions()),
        "reduce_scatter": lambda: g.reduce_scatter(x, [[torch.zeros(2)] * P] * 2, dist.ReduceScatterOptions()),
        "send several": lambda: g.send(x, (r + 1) % P, 0),
        "recv several": lambda: g.recv(x, (r - 1) % P, 0),
        "send sparse": lambda: backend.send([sp], (r + 1) % P, 0),
        "recv sparse": lambda: backend.recv([sp.clone()], (r - 1) % P, 0),
        "recv sparse from any source": lambda: backend.recv_anysource([sp.clone()], 0),
        "dist.send sparse": lambda: dist.send(sp, (r + 1) % P, group=g),
        # (torch's coalescing manager leaves its block open when this raises: the ring after it
        # runs another block, which the C++ backend refused before session 20)
        "batch_isend_irecv sparse": lambda: dist.batch_isend_irecv(
            [dist.P2POp(dist.irecv, sp.clone(), (r - 1) % P, g), dist.P2POp(dist.isend, sp, (r + 1) % P, g)]),
    }
    got = {}
    for name, call in calls.items():
        try:
            call()
            got[name] = None
        except (RuntimeError, ValueError, NotImplementedError) as e:
            got[name] = e
    return got


def _ring(g, r, P, salt):
    """A ring of one send and one receive per rank: right only if no earlier message is pending."""
    recv = torch.zeros(3, dtype=torch.int64)
    ops = [dist.P2POp(dist.irecv, recv, (r - 1) % P, g), dist.P2POp(dist.isend, _data((3,), torch.int64, r, salt),
                                                                     (r + 1) % P, g)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return torch.equal(recv, _data((3,), torch.int64, (r - 1) % P, salt))


def case_list_contract(comm):
    r, P = comm.rank, comm.size
    groups = _groups(comm)
    errors, results = [], {}
    for name, g, backend in groups:
        if name == "cpp":
            with handed_over() as seen:
                results[name] = _several(g, r, P)
                refused = _refusals(g, backend, r, P)
            dispatched = {k for k, e in refused.items() if isinstance(e, NotImplementedError)}
            if seen:
                errors.append(f"cpp handed to the Python backend: {seen}")
        else:
            results[name] = _several(g, r, P)
            refused = _refusals(g, backend, r, P)
        for call, e in refused.items():
            if e is None:
                errors.append(f"{name}: {call} not refused")
            elif name != "gloo" and not isinstance(e, NotImplementedError) and not str(e).startswith(
                    "output_tensors:" if call == "reduce_scatter" else "tensors:"):
                errors.append(f"{name}: {call}: {type(e).__name__}: {e}")
        if not _ring(g, r, P, salt=len(errors) + 40):
            errors.append(f"{name}: a ring after the refusals received the wrong data (something was sent)")
        dist.barrier(group=groups[0][1])
    # torch's dispatcher has no sparse kernel for send: dist.send never reaches gloo's or the C++ backend
    if "dist.send sparse" not in dispatched:
        errors.append("dist.send of a sparse tensor reached the C++ backend")
    for name in ("cpp", "python"):
        for call, want in results["gloo"].items():
            if not torch.equal(results[name][call], want):
                errors.append(f"{name}: {call}: {results[name][call].tolist()} != gloo's {want.tolist()}")
    assert not errors, errors
    return True
