"""Rank side of test_torch_devices.py: torch's helpers that ask a process group for its device,
run over the gloo twin and over commlib in the same processes (backend_cases.setup) and compared
(the distributed-checkpoint cases are in checkpoint_cases.py).

Every case returns a list of failures (empty: all good), each naming what differed. Values are
compared exactly: nothing here reduces floating point (checkpoints and object collectives move
bytes; the DeviceMesh check sums small integers).
"""
from __future__ import annotations

import shutil
import tempfile
import warnings

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import backend_cases as bc


def _quiet(fn, *args):
    """Call one of torch's helpers that warns about its own deprecation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def _groups(st):
    return {"gloo": st["gloo"], "commlib": st["world"]}


def _cpu_placements(P):
    return [f"rank:{r}/cpu" for r in range(P)]


def _shared_dir(gloo):
    """A fresh directory made by rank 0 and named to every rank (all ranks are on this host)."""
    path = [tempfile.mkdtemp(prefix="commlib-dcp-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(path, src=0, group=gloo)
    return path[0]


def _remove_dir(path, gloo):
    dist.barrier(group=gloo)
    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


# -- what a group says about its devices ----------------------------------------------------------
def _device_answers(pg):
    """Everything torch's helpers read off ``pg`` to pick a device."""
    return {
        "_get_pg_default_device": _quiet(c10d._get_pg_default_device, pg),
        "_get_object_coll_device": c10d._get_object_coll_device(pg),
        "cpu in _device_types": torch.device("cpu") in pg._device_types,
        "_get_backend(cpu) answers": _backend_answers(pg, "cpu"),
    }


def _backend_answers(pg, device):
    try:
        return pg._get_backend(torch.device(device)) is not None
    except RuntimeError:
        return False


def _sharded_preferred_device(pg, P):
    from torch.distributed._shard.sharded_tensor import empty
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    spec = ChunkShardingSpec(dim=0, placements=_cpu_placements(P))
    return empty(spec, P, 2, process_group=pg)._get_preferred_device()


def case_device_queries(comm):
    """The default-device helpers, ShardedTensor's preferred device and the backend lookup give
    commlib's groups (world, a subgroup, a "cpu:commlib" group) what they give gloo's."""
    st = bc.setup(comm)
    P, me = comm.size, comm.rank
    fails = []
    low = [r for r in range(P) if r < max(1, P - 1)]  # a proper subgroup when P > 1
    sub = {"gloo": dist.new_group(low, backend="gloo"), "commlib": dist.new_group(low)}
    explicit = dist.new_group(backend="cpu:commlib")
    for what, pair in (("world", _groups(st)), ("subgroup", sub)):
        if me not in low and what == "subgroup":
            continue
        want, got = _device_answers(pair["gloo"]), _device_answers(pair["commlib"])
        if got != want:
            fails.append(f"{what}: commlib {got} != gloo {want}")
    for name, pg in (("gloo", st["gloo"]), ("commlib", st["world"])):
        dev = _sharded_preferred_device(pg, P)
        if dev != torch.device("cpu"):
            fails.append(f"ShardedTensor over {name} prefers {dev}, expected cpu")
    got = _device_answers(explicit)
    if got != _device_answers(st["gloo"]) or explicit._device_types != [torch.device("cpu")]:
        fails.append(f"cpu:commlib group: {got}, device types {explicit._device_types}")
    if dist.get_backend(explicit) != "cpu:commlib" or not isinstance(explicit, type(st["world"])):
        fails.append(f"cpu:commlib group: backend {dist.get_backend(explicit)}, {type(explicit)}")
    x = torch.arange(4, dtype=torch.int64) + me
    dist.all_reduce(x, group=explicit)
    if not torch.equal(x, torch.arange(4) * P + sum(range(P))):
        fails.append(f"cpu:commlib all_reduce gave {x.tolist()}")
    if torch.cuda.is_available() and _backend_answers(st["world"], "cuda") != (
            "cuda" in dist.Backend.backend_capability["commlib"]):
        fails.append("_get_backend(cuda) disagrees with the registration")
    if not torch.cuda.is_available() and _backend_answers(st["world"], "cuda"):
        fails.append("_get_backend(cuda) answers on a build without CUDA")
    for pg in (sub["gloo"], sub["commlib"], explicit):
        if me in low or pg is explicit:
            dist.destroy_process_group(pg)
    return fails


# -- object collectives -------------------------------------------------------------------------
def _object_of(rank, salt):
    """A picklable object whose size differs per rank (uneven pickles), with a tensor inside."""
    return {"rank": rank, "salt": salt, "text": "x" * (7 * rank + salt),
            "tensor": torch.arange(rank + salt, dtype=torch.float64)}


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def case_object_collectives(comm):
    """all_gather_object, broadcast_object_list, scatter_object_list and gather_object from every
    root: commlib's results equal gloo's, object by object."""
    st = bc.setup(comm)
    P, me = comm.size, comm.rank
    fails = []
    results = {}
    for name, pg in _groups(st).items():
        out = {}
        gathered = [None] * P
        dist.all_gather_object(gathered, _object_of(me, 1), group=pg)
        out["all_gather_object"] = gathered
        for root in range(P):
            objs = [_object_of(root, 2), [root] * root, None] if me == root else [None] * 3
            dist.broadcast_object_list(objs, src=root, group=pg)
            out[f"broadcast_object_list root {root}"] = objs
            recv = [None]
            scat = [_object_of(r, 3 + root) for r in range(P)] if me == root else None
            dist.scatter_object_list(recv, scat, src=root, group=pg)
            out[f"scatter_object_list root {root}"] = recv
            got = [None] * P if me == root else None
            dist.gather_object(_object_of(me, 4), got, dst=root, group=pg)
            out[f"gather_object root {root}"] = got
        results[name] = out
    for key, want in results["gloo"].items():
        if not _same(results["commlib"][key], want):
            fails.append(f"{key}: commlib {results['commlib'][key]!r} != gloo {want!r}")
    if not _same(results["gloo"]["all_gather_object"], [_object_of(r, 1) for r in range(P)]):
        fails.append("all_gather_object over gloo did not give every rank's object")
    return fails


# -- ShardedTensor helpers (the checkpoint cases in checkpoint_cases.py use them too) ------------
def _full(shape, salt):
    return torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) * 0.5 + salt


def _sharded(pg, spec, shape, source=None):
    """A ShardedTensor over ``pg`` laid out by ``spec``, filled from ``source`` (else zeros)."""
    from torch.distributed._shard.sharded_tensor import zeros
    t = zeros(spec, *shape, process_group=pg)
    if source is not None:
        for shard in t.local_shards():
            offs, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(source[offs[0]:offs[0] + sizes[0], offs[1]:offs[1] + sizes[1]])
    return t


def _gathered(t, P):
    """The whole of ShardedTensor ``t`` on every rank (gather to each rank in turn)."""
    whole = None
    for dst in range(P):
        out = torch.zeros(t.size()) if dist.get_rank() == dst else None
        t.gather(dst=dst, out=out)
        if out is not None:
            whole = out
    return whole


# -- DeviceMesh sub-meshes -----------------------------------------------------------------------
def _gloo_mesh_2d(shape, names):
    """The same 2-D mesh as init_device_mesh builds, with a gloo group per row and per column
    (every rank creates every group, as new_group requires)."""
    from torch.distributed.device_mesh import DeviceMesh
    grid = torch.arange(shape[0] * shape[1]).reshape(shape)
    me = dist.get_rank()
    mine = []
    for dim in (0, 1):
        lines = grid.transpose(0, 1) if dim == 0 else grid  # the ranks that vary along dim
        for line in lines:
            g = dist.new_group(line.tolist(), backend="gloo")
            if me in line.tolist():
                mine.append(g)
    return DeviceMesh.from_group(mine, "cpu", mesh=grid, mesh_dim_names=names), mine


def _mesh_shape(P):
    return {1: (1, 1), 2: (1, 2), 3: (3, 1), 4: (2, 2)}.get(P, (1, P))


def case_device_mesh_submeshes(comm):
    """A 2-D mesh over commlib and the same over gloo: each 1-D sub-mesh has the same ranks and
    coordinates, answers the device helpers alike, all_reduce and all_gather_object over its
    group agree, and a DTensor redistributed on it gives the same full tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    st = bc.setup(comm)
    P, me = comm.size, comm.rank
    shape, names = _mesh_shape(P), ("outer", "inner")
    meshes = {"commlib": init_device_mesh("cpu", shape, mesh_dim_names=names)}
    meshes["gloo"], gloo_groups = _gloo_mesh_2d(shape, names)
    fails = []
    for dim in names:
        seen = {}
        for name, mesh in meshes.items():
            sub = mesh[dim]
            pg = sub.get_group()
            x = torch.tensor([me + 1, 10 * me], dtype=torch.int64)
            dist.all_reduce(x, group=pg)
            objs = [None] * sub.size()
            dist.all_gather_object(objs, (me, dim), group=pg)
            dt = distribute_tensor(_full((5, 3), salt=me % 2), sub, [Shard(0)])
            seen[name] = {
                "ranks": sub.mesh.tolist(), "coordinate": sub.get_coordinate(),
                "devices": _device_answers(pg), "all_reduce": x.tolist(),
                "all_gather_object": objs,
                "redistributed": dt.redistribute(sub, [Replicate()]).to_local().tolist(),
            }
        if dist.get_backend(meshes["commlib"][dim].get_group()) != "commlib":
            fails.append(f"{dim}: the commlib mesh's group is not on commlib")
        if seen["commlib"] != seen["gloo"]:
            fails.append(f"sub-mesh {dim}: commlib {seen['commlib']} != gloo {seen['gloo']}")
    for g in gloo_groups:
        dist.destroy_process_group(g)
    return fails


# -- CUDA present --------------------------------------------------------------------------------
def case_cuda_registration(comm):
    """With CUDA served: "cuda" registered, the object/default helpers still pick the CPU (as for
    gloo), ShardedTensor prefers the current CUDA device (as for NCCL) and still gathers CPU
    shards into a CPU tensor equal to gloo's, and collectives on CPU tensors stay on the host."""
    from commlib.torch.stream_work import StreamWork
    st = bc.setup(comm)
    P, me = comm.size, comm.rank
    torch.cuda.set_device(0)
    fails = []
    if dist.Backend.backend_capability["commlib"] != ["cpu", "cuda"]:
        fails.append(f"registered {dist.Backend.backend_capability['commlib']}")
    world = st["world"]
    if set(world._device_types) != {torch.device("cpu"), torch.device("cuda")}:
        fails.append(f"device types {world._device_types}")
    for helper in (c10d._get_object_coll_device, c10d._get_pg_default_device):
        got = _quiet(helper, world)
        if torch.device(got) != torch.device("cpu"):
            fails.append(f"{helper.__name__} gives {got}, expected cpu")
    pref = _sharded_preferred_device(world, P)
    if pref != torch.device("cuda", torch.cuda.current_device()):
        fails.append(f"ShardedTensor prefers {pref}")
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    spec = ChunkShardingSpec(dim=0, placements=_cpu_placements(P))
    source = _full((2 * P + 1, 3), salt=1)
    for name, pg in _groups(st).items():
        if not torch.equal(_gathered(_sharded(pg, spec, source.shape, source), P), source):
            fails.append(f"ShardedTensor.gather of CPU shards over {name} differs")
    x = torch.arange(5, dtype=torch.int64) + me
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    if isinstance(work, StreamWork) or not torch.equal(x, torch.arange(5) * P + sum(range(P))):
        fails.append(f"CPU all_reduce: {type(work).__name__}, {x.tolist()}")
    return fails


# -- a call whose tensors are on two devices -----------------------------------------------------
def _refused_over_gloo(call, gloo):
    """Whether ``call`` raises when the default group is gloo's twin (torch's dispatcher decides)."""
    from torch.distributed import distributed_c10d as c10d
    world = c10d._world.default_pg
    c10d._world.default_pg = gloo
    try:
        call()
    except Exception:  # noqa: BLE001 - any refusal counts
        return True
    finally:
        c10d._world.default_pg = world
    return False


def case_mixed_devices(comm, other):
    """Each list collective with one tensor on ``other`` (meta on a CPU build, cuda on a GPU) and
    the rest on the CPU is refused on every rank, naming the odd tensor, before anything is sent:
    an all_reduce right after gives the right sum (no rank was left inside a half-sent call)."""
    st = bc.setup(comm)
    P, me = comm.size, comm.rank
    if other == "cuda":
        torch.cuda.set_device(0)

    def odd(n=3):
        return torch.zeros(n, device=other)

    calls = {
        "all_gather, input elsewhere": (lambda: dist.all_gather(
            [torch.zeros(3) for _ in range(P)], odd()), "tensor"),
        "all_gather, one output elsewhere": (lambda: dist.all_gather(
            [torch.zeros(3) for _ in range(P - 1)] + [odd()], torch.zeros(3)), f"tensor_list[{P - 1}]"),
        "all_to_all, inputs elsewhere": (lambda: dist.all_to_all(
            [torch.zeros(3) for _ in range(P)], [odd() for _ in range(P)]), "input_tensor_list[0]"),
        "all_reduce_coalesced": (lambda: dist.all_reduce_coalesced(
            [torch.zeros(2), odd()]), "tensors[1]"),
        "all_gather_coalesced": (lambda: dist.all_gather_coalesced(
            [[torch.zeros(3)] for _ in range(P)], [odd()]), "input_tensor_list[0]"),
        "reduce_scatter, one input elsewhere": (lambda: dist.reduce_scatter(
            torch.zeros(3), [torch.zeros(3) for _ in range(P - 1)] + [odd()]),
            f"input_list[{P - 1}]"),
    }
    fails = []
    for what, (call, name) in calls.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # all_reduce_coalesced's deprecation
                call()
        except ValueError as e:
            msg = str(e)
            if not (msg.startswith(f"{name}: is on") or f"but {name} is on" in msg):
                fails.append(f"{what}: message does not name {name}: {msg}")
        except NotImplementedError as e:
            # torch's dispatcher picks the kernel by the tensors' devices: with a meta tensor in
            # the call (the CPU build's stand-in) it refuses before any backend runs, as for gloo.
            if other != "meta" or "Meta" not in str(e):
                fails.append(f"{what}: {e}")
        else:
            # With meta tensors torch's dispatcher may run its own Meta kernel (which does
            # nothing) instead of any backend: not ours to refuse when gloo's group lets it by too.
            if other != "meta" or _refused_over_gloo(calls[what][0], st["gloo"]):
                fails.append(f"{what}: not refused")
        x = torch.full((4,), me + 1, dtype=torch.int64)
        dist.all_reduce(x)
        if x.tolist() != [P * (P + 1) // 2] * 4:
            fails.append(f"{what}: the next all_reduce gave {x.tolist()}")
    if other == "cuda":
        fails += _gather_scatter_across_devices(P, me)
    return fails


def _gather_scatter_across_devices(P, me):
    """gather's gather_list and scatter's scatter_list may lie on another device than the
    tensor sent or received (ShardedTensor.gather stages on the GPU into a CPU tensor): the
    values arrive exactly, from every root."""
    fails = []
    for root in range(P):
        inp = torch.arange(5, dtype=torch.int64, device="cuda") + 10 * me
        outs = [torch.zeros(5, dtype=torch.int64) for _ in range(P)] if me == root else None
        dist.gather(inp, outs, dst=root)
        if me == root and [o.tolist() for o in outs] != [
                [10 * r + i for i in range(5)] for r in range(P)]:
            fails.append(f"gather cuda -> cpu list, root {root}: {[o.tolist() for o in outs]}")
        out = torch.zeros(4, dtype=torch.int64, device="cuda")
        ins = [torch.full((4,), 100 * root + r, dtype=torch.int64) for r in range(P)]
        dist.scatter(out, ins if me == root else None, src=root)
        if out.cpu().tolist() != [100 * root + me] * 4:
            fails.append(f"scatter cpu list -> cuda, root {root}: {out.cpu().tolist()}")
    return fails
