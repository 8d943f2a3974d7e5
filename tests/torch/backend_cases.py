"""What the torch backend's rank-side cases share (run by commlib.testing rank pools): the process's
torch.distributed set-up, the tolerances, comparisons, data, batches and meshes. The cases are in
backend_collective_cases.py (dist.* against gloo), backend_training_cases.py (DDP, FSDP2/HSDP,
DTensor, functional collectives) and backend_error_cases.py (errors, options).

Each worker process initialises torch.distributed once with backend "commlib" (tcp:// rendezvous on
a port that rank 0 picks and shares through the pool's communicator) and also creates a gloo group
over the same ranks; every case runs an operation on both and compares. Everything heavy is cached
per process so the long-lived pool pays for it once.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from commlib.bootstrap.ports import free_port

_STATE: dict = {}

# tolerances: fp32 results of a reduction whose summation order differs from the reference
RTOL, ATOL = 1e-5, 1e-6
# DDP vs single-process full-batch training after 20 SGD steps (fp32)
DDP_RTOL, DDP_ATOL = 1e-4, 1e-5
# FSDP2/HSDP losses vs the same script over gloo (fp32)
FSDP_RTOL, FSDP_ATOL = 1e-5, 1e-6


def setup(comm):
    """Initialise the default "commlib" group and a gloo twin once per process."""
    if "gloo" in _STATE:
        return _STATE
    import commlib.torch  # noqa: F401  (registers the backend)
    port = torch.tensor([free_port() if comm.rank == 0 else 0], dtype=torch.int64)
    comm.broadcast(port, root=0)
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{int(port.item())}",
                            rank=comm.rank, world_size=comm.size,
                            timeout=datetime.timedelta(seconds=60))
    _STATE["gloo"] = dist.new_group(backend="gloo")
    _STATE["world"] = dist.group.WORLD
    from commlib.torch import native
    if native.load() is not None:  # every case on this set-up runs on the C++ backend (issue #44)
        backend = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
        assert backend == "CommlibBackend", f"the default group's CPU backend is {backend}, not the C++ one"
    return _STATE


# float16/bfloat16 partial results travel in their own precision between reduction steps (as in
# NCCL), so allow about one unit in the last place per step: of the partial sum rounded at that step,
# not of the result. The data are standard normals, whose partial sums are of the full sums' scale,
# so the largest result of the tensor stands for them; an element where the inputs cancel differs
# from gloo's by the partials' rounding, which gloo's order (another than commlib's, whose small
# reductions on one host run in rank order: docs/transports.md "Flag calls") rounds elsewhere.
_HALF_RTOL = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _cmp(name, got, want, exact, steps=4):
    if exact or not got.is_floating_point():
        ok = torch.equal(got, want)
    elif got.dtype in _HALF_RTOL:
        ulps = _HALF_RTOL[got.dtype] * steps
        scale = float(want.double().abs().max()) if want.numel() else 0.0
        ok = torch.allclose(got.double(), want.double(), rtol=ulps, atol=max(1e-3, ulps * scale))
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


def _batch(step, n):
    """Step ``step``'s (inputs, targets) of ``n`` rows, the same in every process."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


def _mesh(st, kind, shape):
    """A 1-D ("dp") or 2-D ("replicate", "shard") CPU DeviceMesh of ``shape`` over commlib
    (``kind`` "commlib") or over gloo groups ("gloo"), built once per process (cached in ``st``)."""
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
