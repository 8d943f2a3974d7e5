"""Rank side of test_cuda_backend.py: the "commlib" backend on CUDA tensors (every rank on GPU 0:
several ranks per GPU, which NCCL refuses), checked against gloo on CPU copies of the same data in
the same processes. Returns lists of failures (empty: all good).

Tolerances: fp32 collectives rtol 1e-5 / atol 1e-6 (the reduction order differs from gloo's),
integers exact. DDP/FSDP2 losses rtol 1e-4 / atol 1e-5 after a few steps: the GPU's matmul and
reduction kernels round differently from the CPU's even in fp32 (TF32 is switched off).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import backend_cases as bc

RTOL, ATOL = 1e-5, 1e-6
TRAIN_RTOL, TRAIN_ATOL = 1e-4, 1e-5


def _cuda_setup(comm):
    st = bc.setup(comm)
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return st


def _close(got, want):
    got = got.cpu()
    if not got.is_floating_point():
        return torch.equal(got, want)
    return torch.allclose(got.double(), want.double(), rtol=RTOL, atol=ATOL)


def case_cuda_collectives(comm):
    """Each collective on CUDA tensors (blocking, async + wait, and issued on a side stream)
    equals gloo's on the same data on the CPU."""
    st = _cuda_setup(comm)
    gloo, P, me = st["gloo"], comm.size, comm.rank
    failures = []

    def data(n, dtype, salt):
        g = torch.Generator().manual_seed(100 * salt + me)
        if dtype.is_floating_point:
            return torch.randn(n, generator=g).to(dtype)
        return torch.randint(0, 50, (n,), generator=g).to(dtype)

    cases = {
        "all_reduce": lambda x, o, grp, a: dist.all_reduce(x, group=grp, async_op=a),
        "all_reduce max": lambda x, o, grp, a: dist.all_reduce(x, op=dist.ReduceOp.MAX, group=grp,
                                                               async_op=a),
        "broadcast": lambda x, o, grp, a: dist.broadcast(x, src=P - 1, group=grp, async_op=a),
        "reduce": lambda x, o, grp, a: dist.reduce(x, dst=0, group=grp, async_op=a),
        "all_gather_into_tensor": lambda x, o, grp, a: dist.all_gather_into_tensor(o, x, group=grp,
                                                                                   async_op=a),
        "all_to_all_single": lambda x, o, grp, a: dist.all_to_all_single(o, x, group=grp,
                                                                         async_op=a),
    }
    for dtype in (torch.float32, torch.int64):
        for n in (1, 6 * P, 100_000):
            for salt, (name, fn) in enumerate(cases.items()):
                n_in = n * P if name == "all_to_all_single" else n
                n_out = n * P if name in ("all_gather_into_tensor", "all_to_all_single") else 1
                x_cpu, o_cpu = data(n_in, dtype, salt), torch.zeros(n_out, dtype=dtype)
                fn(x_cpu, o_cpu, gloo, False)
                want = o_cpu if n_out > 1 else x_cpu
                for mode in ("blocking", "async", "side stream"):
                    x, o = data(n_in, dtype, salt).cuda(), torch.zeros(n_out, dtype=dtype).cuda()
                    if mode == "blocking":
                        fn(x, o, None, False)
                    elif mode == "async":
                        w = fn(x, o, None, True)
                        w.wait()  # the current stream waits: the next kernel sees the result
                    else:
                        s = torch.cuda.Stream()
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            w = fn(x, o, None, True)
                        w.wait()  # the default stream waits for the side stream's call
                    got = (o if n_out > 1 else x) * 1  # a kernel on the current stream
                    if name == "reduce" and me != 0:
                        continue  # reduce leaves non-roots' buffers unspecified
                    if not _close(got, want):
                        failures.append(f"{name} {dtype} n={n} {mode}: differs from gloo")
    torch.cuda.synchronize()
    return failures


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _train(model, opt, device, rank, steps, per_rank):
    """`steps` SGD steps of `model` on this rank's batches (moved to `device`); the losses."""
    losses = []
    for step in range(steps):
        x, y = bc._batch(1000 * step + rank, per_rank)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


def case_cuda_ddp(comm, steps=8, per_rank=4):
    """DDP over commlib on a CUDA model vs DDP over gloo on the same model on the CPU: losses and
    final parameters within the training tolerance."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    st = _cuda_setup(comm)
    runs = {}
    for kind, device, group in (("commlib", "cuda", None), ("gloo", "cpu", st["gloo"])):
        model = _mlp(0).to(device)
        ddp = DDP(model, device_ids=[0] if device == "cuda" else None, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        losses = _train(ddp, opt, device, comm.rank, steps, per_rank)
        runs[kind] = (losses, [p.detach().cpu() for p in model.parameters()])
    (l1, p1), (l2, p2) = runs["commlib"], runs["gloo"]
    failures = []
    if not torch.allclose(l1, l2, rtol=TRAIN_RTOL, atol=TRAIN_ATOL):
        failures.append(f"DDP losses: commlib/cuda {l1.tolist()} vs gloo/cpu {l2.tolist()}")
    for a, b in zip(p1, p2):
        if not torch.allclose(a, b, rtol=TRAIN_RTOL, atol=TRAIN_ATOL):
            failures.append(f"DDP parameters differ by {(a - b).abs().max().item():.3g}")
    return failures


def case_cuda_fsdp(comm, steps=6):
    """FSDP2 over commlib on a CUDA mesh vs FSDP2 over gloo on a CPU mesh: losses within the
    training tolerance."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    st = _cuda_setup(comm)
    meshes = {"commlib": (init_device_mesh("cuda", (comm.size,), mesh_dim_names=("dp",)), "cuda"),
              "gloo": (DeviceMesh.from_group(st["gloo"], "cpu", mesh_dim_names=("dp",)), "cpu")}
    losses = {}
    for kind, (mesh, device) in meshes.items():
        model = _mlp(0).to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        out = []
        for step in range(steps):
            x, y = bc._batch(1000 * step + comm.rank, 4)
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        losses[kind] = torch.tensor(out)
    if not torch.allclose(losses["commlib"], losses["gloo"], rtol=TRAIN_RTOL, atol=TRAIN_ATOL):
        return [f"FSDP2 losses: commlib/cuda {losses['commlib'].tolist()} vs "
                f"gloo/cpu {losses['gloo'].tolist()}"]
    return []


def case_cuda_parallel_wrappers(comm, steps=5, per_rank=4):
    """commlib.parallel's DataParallel, ZeroOptimizer (stage 2) and FullyShardedModule on a CUDA
    model vs the same wrapper on the CPU, over the same communicator: losses within the training
    tolerance."""
    import commlib.parallel as par
    _cuda_setup(comm)
    failures = []
    for method in ("dp", "zero2", "fsdp"):
        losses = {}
        for device in ("cpu", "cuda"):
            model = _mlp(0).to(device)
            if method == "dp":
                run = par.DataParallel(model, comm, bucket_cap_mb=0.001)
                opt = torch.optim.SGD(run.parameters(), lr=0.1)
            elif method == "zero2":
                run = model
                opt = par.ZeroOptimizer(torch.optim.SGD, model.parameters(), comm, stage=2, lr=0.1)
            else:
                run = par.FullyShardedModule(model, comm)
                opt = torch.optim.SGD(run.parameters(), lr=0.1)
            losses[device] = _train(run, opt, device, comm.rank, steps, per_rank)
        if not torch.allclose(losses["cuda"], losses["cpu"], rtol=TRAIN_RTOL, atol=TRAIN_ATOL):
            failures.append(f"{method}: losses on cuda {losses['cuda'].tolist()} vs cpu "
                            f"{losses['cpu'].tolist()}")
    return failures
