"""Rank side of test_torch_devices.py's distributed-checkpoint cases: ShardedTensor and DTensor through
dcp.save/dcp.load with another sharding on load, full state dicts of an FSDP2 model, and a DTensor
checkpoint on a CUDA mesh, over the gloo twin and over commlib (helpers: device_helper_cases.py).

Every case returns a list of failures (empty: all good). Values are compared exactly: checkpoints
move bytes.
"""
from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

import backend_cases as bc
from device_helper_cases import _cpu_placements, _full, _gathered, _groups, _remove_dir, _shared_dir, _sharded


# -- distributed checkpoint: ShardedTensor -------------------------------------------------------
def _uneven_plan(P, shape):
    """An EnumerableShardingSpec of P blocks on a 2-D grid of uneven rows (rank r holds rows
    [r*(r+1)/2 ...) of a 1 + 2 + ... split): a plan unlike the chunked ones."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    rows = [r + 1 for r in range(P)]
    rows[-1] += shape[0] - sum(rows)
    shards, off = [], 0
    for r, n in enumerate(rows):
        shards.append(ShardMetadata(shard_offsets=[off, 0], shard_sizes=[n, shape[1]],
                                    placement=f"rank:{r}/cpu"))
        off += n
    return EnumerableShardingSpec(shards)


def case_dcp_sharded_tensor(comm):
    """ShardedTensor through dcp.save/dcp.load on the filesystem, loaded with another sharding
    (row-wise to column-wise, chunked to an uneven enumerable plan, sharded to a plain tensor),
    and ShardedTensor.gather: over gloo and over commlib, both equal to the tensor saved."""
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    st = bc.setup(comm)
    P = comm.size
    shape = (2 * P + 3, P + 2)
    rows = ChunkShardingSpec(dim=0, placements=_cpu_placements(P))
    cols = ChunkShardingSpec(dim=1, placements=_cpu_placements(P))
    fails = []
    for name, pg in _groups(st).items():
        path = _shared_dir(st["gloo"])
        try:
            source = _full(shape, salt=len(name))
            saved = _sharded(pg, rows, shape, source)
            dcp.save({"w": saved, "step": torch.tensor(7)}, checkpoint_id=path, process_group=pg)
            checks = {
                "rows -> columns": {"w": _sharded(pg, cols, shape)},
                "rows -> uneven plan": {"w": _sharded(pg, _uneven_plan(P, shape), shape)},
                "sharded -> plain tensor": {"w": torch.zeros(shape)},
            }
            for what, sd in checks.items():
                sd["step"] = torch.tensor(0)
                dcp.load(sd, checkpoint_id=path, process_group=pg)
                w = sd["w"]
                got = w if isinstance(w, torch.Tensor) and not hasattr(w, "local_shards") \
                    else _gathered(w, P)
                if not torch.equal(got, source) or int(sd["step"]) != 7:
                    fails.append(f"{name} {what}: loaded {got.flatten()[:6].tolist()}, "
                                 f"step {int(sd['step'])}")
            if not torch.equal(_gathered(saved, P), source):
                fails.append(f"{name}: ShardedTensor.gather differs from the tensor saved")
        finally:
            _remove_dir(path, st["gloo"])
    return fails


# -- distributed checkpoint: DTensor -------------------------------------------------------------
def _meshes(st, P):
    return {kind: bc._mesh(st, kind, (P,)) for kind in ("gloo", "commlib")}


def case_dcp_dtensor(comm):
    """DTensor through dcp.save/dcp.load on the filesystem: saved as Shard(0), loaded as Shard(1)
    and as Replicate, on a mesh over gloo and one over commlib; both equal the tensor saved."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    st = bc.setup(comm)
    P = comm.size
    shape = (2 * P + 1, P + 3)  # neither dimension divides evenly: uneven shards
    fails = []
    for name, mesh in _meshes(st, P).items():
        pg = mesh.get_group()
        path = _shared_dir(st["gloo"])
        try:
            source = _full(shape, salt=3 + len(name))
            dcp.save({"w": distribute_tensor(source, mesh, [Shard(0)])}, checkpoint_id=path,
                     process_group=pg)
            for placement in (Shard(1), Replicate()):
                sd = {"w": distribute_tensor(torch.zeros(shape), mesh, [placement])}
                dcp.load(sd, checkpoint_id=path, process_group=pg)
                got = sd["w"].full_tensor()
                if not torch.equal(got, source):
                    fails.append(f"{name} Shard(0) -> {placement}: {got.flatten()[:6].tolist()}")
        finally:
            _remove_dir(path, st["gloo"])
    return fails


# -- full state dicts of an FSDP2 model (torch's _state_dict_utils) --------------------------------
def case_full_state_dict(comm):
    """An FSDP2 model loaded from rank 0's full state dict (``broadcast_from_rank0``: torch
    broadcasts on a device it picks from ``group._device_types``) and read back as a full state
    dict (all-gathers of the shards): over gloo and over commlib, equal to what rank 0 had."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict)
    from torch.distributed.fsdp import fully_shard
    st = bc.setup(comm)
    P, me = comm.size, comm.rank
    fails = []
    g = torch.Generator().manual_seed(11)
    source = {"0.weight": torch.randn(2 * P + 1, 3, generator=g),
              "0.bias": torch.randn(2 * P + 1, generator=g),
              "1.weight": torch.randn(2, 2 * P + 1, generator=g)}
    for name, mesh in _meshes(st, P).items():
        torch.manual_seed(me)  # every rank starts from different values
        model = torch.nn.Sequential(torch.nn.Linear(3, 2 * P + 1),
                                    torch.nn.Linear(2 * P + 1, 2, bias=False))
        fully_shard(model, mesh=mesh)
        given = {k: v.clone() for k, v in source.items()} if me == 0 else {}  # torch edits it
        set_model_state_dict(model, given, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))
        got = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        for key, want in source.items():
            if not torch.equal(got[key], want):
                fails.append(f"{name} {key}: {got[key].flatten()[:4].tolist()}")
    return fails


# -- CUDA present --------------------------------------------------------------------------------
def case_cuda_dcp(comm):
    """dcp.save/dcp.load of a DTensor on a CUDA mesh over commlib (Shard(0) -> Shard(1)) equals
    the same on a CPU mesh over gloo."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    st = bc.setup(comm)
    P = comm.size
    torch.cuda.set_device(0)
    shape = (2 * P + 1, P + 3)
    source = _full(shape, salt=2)
    fails, got = [], {}
    meshes = {"gloo": DeviceMesh.from_group(st["gloo"], "cpu"),
              "commlib": init_device_mesh("cuda", (P,))}
    for name, mesh in meshes.items():
        path = _shared_dir(st["gloo"])
        try:
            dcp.save({"w": distribute_tensor(source.to(mesh.device_type), mesh, [Shard(0)])},
                     checkpoint_id=path, process_group=mesh.get_group())
            sd = {"w": distribute_tensor(torch.zeros(shape, device=mesh.device_type), mesh,
                                         [Shard(1)])}
            dcp.load(sd, checkpoint_id=path, process_group=mesh.get_group())
            got[name] = sd["w"].full_tensor().cpu()
        finally:
            _remove_dir(path, st["gloo"])
    if not (torch.equal(got["gloo"], source) and torch.equal(got["commlib"], source)):
        fails.append(f"CUDA DTensor checkpoint: commlib {got['commlib'].flatten()[:6].tolist()}")
    return fails
