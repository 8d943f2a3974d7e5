"""Rank side of tests/torch/test_torch_native.py's process-group test: a commlib group is commlib's
own C++ ProcessGroup (csrc/torch_backend/process_group.h), set up as torch sets up its own for a
plugin and named "commlib", on the set-up of backend_cases.py."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _world

from backend_cases import setup


def _describe(group):
    """What torch and its users read off a group."""
    return {"type": type(group).__name__, "name": group.name(), "backend_name": group._get_backend_name(),
            "devices": [str(d) for d in group._device_types], "rank": group.rank(), "size": group.size(),
            "group_name": group.group_name, "group_desc": group.group_desc,
            "registered_name": _world.pg_names.get(group), "bound_device": group.bound_device_id,
            "backends": {str(d): type(group._get_backend(d)).__name__ for d in group._device_types}}


def case_process_group(comm):
    """The groups torch makes on commlib, described (_describe), with an all_reduce on each and
    DDP's logged backend name. A backend string that gives another device to another backend
    ("cpu:commlib,cuda:gloo") keeps torch's own group, which holds both backends."""
    from commlib.torch import native
    st = setup(comm)
    r, n = comm.rank, comm.size
    made = {"world": st["world"], "new_group": dist.new_group(backend="commlib", group_desc="a commlib group"),
            "cpu:commlib": dist.new_group(backend="cpu:commlib"),
            "mixed": dist.new_group(backend="cpu:commlib,cuda:gloo", group_desc="mixed")}
    seen = {k: _describe(g) for k, g in made.items()}
    for k, g in made.items():
        t = torch.full((5,), float(r + 1))
        dist.all_reduce(t, group=g)
        assert torch.equal(t, torch.full((5,), n * (n + 1) / 2)), (k, t)
        seen[k]["cpu_backend_is_cpp"] = isinstance(g._get_backend(torch.device("cpu")), native.load().CommlibBackend)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    seen["ddp_backend_name"] = model._get_ddp_logging_data()["backend_name"]
    for k in ("new_group", "cpu:commlib", "mixed"):
        dist.destroy_process_group(made[k])
    return seen
