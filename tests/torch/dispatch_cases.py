"""Rank side of tests/torch/test_torch_native.py: what torch's dispatcher sees of commlib's eager
collectives (the C++ c10d::Backend, commlib/torch/native.py), compared with gloo's, in the same
processes, on the set-up of backend_cases.py."""
from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

from backend_cases import setup


class C10dOps(TorchDispatchMode):
    """Counts every op of torch's c10d namespace the dispatcher runs (sends and receives too,
    which CommDebugMode leaves out)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _eager_calls(group):
    r, n = dist.get_rank(group), dist.get_world_size(group)
    src = dist.get_global_rank(group, 0)
    t = torch.full((4,), float(r + 1))
    dist.all_reduce(t, group=group)
    dist.broadcast(t, src=src, group=group)
    out = torch.empty(4)
    dist.scatter(out, [torch.full((4,), float(i)) for i in range(n)] if r == 0 else None, src=src, group=group)
    gathered = torch.empty(4 * n)
    dist.all_gather_into_tensor(gathered, t, group=group)
    reduced = torch.empty(4)
    dist.reduce_scatter_tensor(reduced, torch.arange(4.0 * n), group=group)
    swapped = torch.empty(4 * n)
    dist.all_to_all_single(swapped, torch.arange(4.0 * n) + 100 * r, group=group)
    if r == 0:
        dist.send(t, dist.get_global_rank(group, 1), group=group)
    elif r == 1:
        dist.recv(out, dist.get_global_rank(group, 0), group=group)
    return [t, out, gathered, reduced, swapped]


def case_dispatch_counts(comm):
    """(CommDebugMode's counts, c10d ops counted) over gloo and over commlib: equal, and
    results equal too."""
    import commlib._C as _C
    st = setup(comm)
    seen = {}
    for name in ("gloo", "world"):
        offers = _C.fast_path_counts()[0]
        with CommDebugMode() as debug, C10dOps() as ops:
            results = _eager_calls(st[name])
        # The Python backend offers every collective to _C.fast_collective first: none did, so
        # the C++ backend ran them on the core itself.
        assert _C.fast_path_counts()[0] == offers, f"{name}: a call went through the Python backend"
        seen[name] = ({str(k): v for k, v in debug.get_comm_counts().items()}, dict(ops.counts), results)
    for a, b in zip(seen["gloo"][2], seen["world"][2]):
        assert torch.equal(a, b), f"commlib {b.tolist()} != gloo {a.tolist()}"
    return seen["gloo"][:2], seen["world"][:2]


def case_detail_wrapper(comm):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL (the level set at run time: torch reads it when it creates a
    group) wraps a new commlib group's C++ backend in torch's ProcessGroupWrapper, as for any plugin:
    calls that match give the gloo group's results, an all_reduce whose shape differs across ranks
    raises the wrapper's mismatch error on every rank before anything is sent (the group stays
    usable), and commlib's helpers still find the group's communicator. Returns the wrapper's
    type name and the mismatch error's message."""
    import commlib.torch as ct
    from torch.distributed import DebugLevel, get_debug_level, set_debug_level
    st = setup(comm)
    r = comm.rank
    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    try:
        g = dist.new_group(backend="commlib")
    finally:
        set_debug_level(before)
    wrapper = type(g._get_backend(torch.device("cpu"))).__name__
    assert ct.get_communicator(g).size == comm.size
    t = torch.arange(6.0) * (r + 1)
    ref = t.clone()
    dist.all_reduce(t, group=g)
    dist.all_reduce(ref, group=st["gloo"])
    assert torch.equal(t, ref), (t, ref)
    try:
        dist.all_reduce(torch.ones(4 + r), group=g)
        message = "no error"
    except RuntimeError as e:
        message = str(e)
    dist.broadcast(t, src=0, group=g)  # still usable: the mismatched call never went out
    assert torch.equal(t, ref), (t, ref)
    dist.destroy_process_group(g)
    return wrapper, message
