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


def _cpp_device_calls():
    """Device calls the C++ backend ran itself so far in this process (commlib._C's counter of the
    device call cache's C++ entry, csrc/torch_backend/device_calls.cc)."""
    from commlib import _C
    return _C.device_native_counts()[1]


def case_cuda_cpp_steady(comm, rounds=4):
    """Calls repeated on the same CUDA tensors (as DDP's buckets and FSDP2's buffers are): the first
    of each shape (tensors, op, root, stream) runs on the Python path, which checks it and fills the
    device call cache; every later one runs from the C++ backend (counted). Blocking, async with
    wait() from another stream than the issuing one, through get_future(), and a coalesced block of
    two all_gathers (one call per pair); integers, exact."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    _cuda_setup(comm)
    P, me, S = comm.size, comm.rank, comm.size * (comm.size + 1) // 2
    failures = []
    x = torch.zeros(1000, dtype=torch.int64, device="cuda")
    y = torch.zeros(1000, dtype=torch.int64, device="cuda")
    gathered = torch.zeros(1000 * P, dtype=torch.int64, device="cuda")
    scattered = torch.zeros(1000, dtype=torch.int64, device="cuda")
    a2a = torch.zeros(1000 * P, dtype=torch.int64, device="cuda")
    x2, gathered2 = torch.zeros_like(x), torch.zeros_like(gathered)
    side = torch.cuda.Stream()
    per_round = 10
    before = _cpp_device_calls()
    for k in range(rounds):
        def check(what, got, want):
            if not torch.equal(got.cpu(), want):
                failures.append(f"round {k} {what}: {got.cpu()[:4].tolist()} expected {want[:4].tolist()}")
        x.fill_(me + 1)
        dist.all_reduce(x)  # blocking
        check("all_reduce", x, torch.full((1000,), S))
        x.fill_(me + 1)
        dist.all_reduce(x, async_op=True).wait()
        check("async all_reduce", x, torch.full((1000,), S))
        x.fill_(me + 1)
        value = dist.all_reduce(x, async_op=True).get_future().wait()[0]
        check("get_future's value", value * 1, torch.full((1000,), S))  # a kernel on the current stream
        y.fill_(me + 2)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            w = dist.all_reduce(y, async_op=True)
        w.wait()  # the current stream waits for the side stream's call
        check("all_reduce on a side stream", y * 1, torch.full((1000,), S + P))
        x.fill_(me)
        dist.all_gather_into_tensor(gathered, x)
        check("all_gather_into_tensor", gathered, torch.arange(P).repeat_interleave(1000))
        x2.fill_(me + 100)
        with _coalescing_manager(device=x.device, async_ops=True) as cm:  # allgather_into_tensor_coalesced
            dist.all_gather_into_tensor(gathered, x)
            dist.all_gather_into_tensor(gathered2, x2)
        cm.wait()
        check("coalesced all_gather", gathered, torch.arange(P).repeat_interleave(1000))
        check("coalesced all_gather (2)", gathered2, torch.arange(P).repeat_interleave(1000) + 100)
        gathered.copy_(torch.arange(P, device="cuda").repeat_interleave(1000) + me)
        dist.reduce_scatter_tensor(scattered, gathered)
        check("reduce_scatter_tensor", scattered, torch.full((1000,), me * P + S - P))
        gathered.copy_(torch.arange(1000 * P, device="cuda") + 10_000 * me)
        dist.all_to_all_single(a2a, gathered)
        check("all_to_all_single", a2a, torch.cat([torch.arange(1000 * me, 1000 * me + 1000) + 10_000 * q
                                                   for q in range(P)]))
        x.fill_(me + 7)
        dist.broadcast(x, src=P - 1)
        check("broadcast", x, torch.full((1000,), P - 1 + 7))
    torch.cuda.synchronize()
    ran = _cpp_device_calls() - before
    if ran < (rounds - 1) * per_round:
        failures.append(f"the C++ backend ran {ran} of {rounds * per_round} calls itself; expected every call "
                        f"after the first round ({(rounds - 1) * per_round})")
    return failures


def case_cuda_ddp(comm, steps=8, per_rank=4):
    """DDP over commlib on a CUDA model vs DDP over gloo on the same model on the CPU: losses and
    final parameters within the training tolerance; some of DDP's bucket all_reduces (those after
    its buckets settled) run from the C++ backend itself."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    st = _cuda_setup(comm)
    runs = {}
    before = _cpp_device_calls()
    for kind, device, group in (("commlib", "cuda", None), ("gloo", "cpu", st["gloo"])):
        model = _mlp(0).to(device)
        ddp = DDP(model, device_ids=[0] if device == "cuda" else None, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        losses = _train(ddp, opt, device, comm.rank, steps, per_rank)
        runs[kind] = (losses, [p.detach().cpu() for p in model.parameters()])
    (l1, p1), (l2, p2) = runs["commlib"], runs["gloo"]
    failures = []
    if _cpp_device_calls() == before:
        failures.append("DDP: no bucket all_reduce ran from the C++ backend (all handed to the Python backend)")
    if not torch.allclose(l1, l2, rtol=TRAIN_RTOL, atol=TRAIN_ATOL):
        failures.append(f"DDP losses: commlib/cuda {l1.tolist()} vs gloo/cpu {l2.tolist()}")
    for a, b in zip(p1, p2):
        if not torch.allclose(a, b, rtol=TRAIN_RTOL, atol=TRAIN_ATOL):
            failures.append(f"DDP parameters differ by {(a - b).abs().max().item():.3g}")
    return failures


def _fsdp2_trained(mesh, device, rank, steps, after_shard=lambda model: None):
    """_mlp(0) on `device`, each Linear and then the model fully_shard-ed on `mesh`, then
    `after_shard(model)` (e.g. a compression hook), trained `steps` Adam steps (lr 1e-2) on this
    rank's batches: (the model, its losses as a tensor, what after_shard returned)."""
    from torch.distributed.fsdp import fully_shard
    model = _mlp(0).to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shaped = after_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    out = []
    for step in range(steps):
        x, y = bc._batch(1000 * step + rank, 4)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return model, torch.tensor(out), shaped


def case_cuda_fsdp(comm, steps=6):
    """FSDP2 over commlib on a CUDA mesh vs FSDP2 over gloo on a CPU mesh: losses within the
    training tolerance."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    st = _cuda_setup(comm)
    meshes = {"commlib": (init_device_mesh("cuda", (comm.size,), mesh_dim_names=("dp",)), "cuda"),
              "gloo": (DeviceMesh.from_group(st["gloo"], "cpu", mesh_dim_names=("dp",)), "cpu")}
    losses = {}
    for kind, (mesh, device) in meshes.items():
        _, losses[kind], _ = _fsdp2_trained(mesh, device, comm.rank, steps)
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


def _p2p_message(src, dst, n, dtype, salt=0):
    """A message whose values name its sender, receiver and salt (exact in every dtype used)."""
    return ((torch.arange(n) % 97) + src * 1000 + dst * 100 + salt).to(dtype)


def case_cuda_point_to_point(comm):
    """send/recv/isend/irecv/batch_isend_irecv on CUDA tensors: blocking fan-out and fan-in,
    receive-first isend/irecv rings, a batch_isend_irecv ring, a non-contiguous receive, an
    exchange issued on a side stream (read there after wait()), an uneven all_to_all_single, gather
    (CUDA and CPU lists), scatter from a CPU list, a list all_to_all, and recv without src refused. Values are compared exactly. On the C++ backend the batches after the first on a stream run
    from C++ (csrc/torch_backend/device_p2p.cc; counted)."""
    from commlib import _C
    from commlib.torch import native
    _cuda_setup(comm)
    cpp_batches = _C.device_native_p2p_count()
    P, me = comm.size, comm.rank
    nxt, prv = (me + 1) % P, (me - 1) % P
    failures = []

    def check(name, got, want):
        if not torch.equal(got.cpu(), want):
            failures.append(f"{name}: got {got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}")

    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for n in (0, 1, 70001):
            tag = f"{dtype} n={n}"
            if me == 0:  # blocking fan-out, then fan-in
                for q in range(1, P):
                    dist.send(_p2p_message(0, q, n, dtype).cuda(), q)
                for q in range(1, P):
                    y = torch.zeros(n, dtype=dtype, device="cuda")
                    dist.recv(y, q)
                    check(f"blocking recv from {q} {tag}", y, _p2p_message(q, 0, n, dtype))
            else:
                y = torch.zeros(n, dtype=dtype, device="cuda")
                dist.recv(y, 0)
                check(f"blocking recv from 0 {tag}", y, _p2p_message(0, me, n, dtype))
                dist.send(_p2p_message(me, 0, n, dtype).cuda(), 0)
            y = torch.zeros(n, dtype=dtype, device="cuda")  # receive-first ring
            wr = dist.irecv(y, prv)
            ws = dist.isend(_p2p_message(me, nxt, n, dtype, 1).cuda(), nxt)
            wr.wait()
            ws.wait()
            check(f"irecv/isend ring {tag}", y * 1, _p2p_message(prv, me, n, dtype, 1))
            y = torch.zeros(n, dtype=dtype, device="cuda")
            ops = [dist.P2POp(dist.irecv, y, prv),
                   dist.P2POp(dist.isend, _p2p_message(me, nxt, n, dtype, 2).cuda(), nxt)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            check(f"batch_isend_irecv ring {tag}", y, _p2p_message(prv, me, n, dtype, 2))

    out = torch.zeros(4, 6, device="cuda").t()  # non-contiguous: staged, copied back on the p2p stream
    ops = [dist.P2POp(dist.isend, _p2p_message(me, nxt, 24, torch.float32, 3).view(6, 4).cuda(), nxt),
           dist.P2POp(dist.irecv, out, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("non-contiguous receive", out, _p2p_message(prv, me, 24, torch.float32, 3).view(6, 4))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x = _p2p_message(me, nxt, 1 << 20, torch.float32, 4).cuda() * 1  # produced on s
        y = torch.zeros(1 << 20, device="cuda")
        works = [dist.irecv(y, prv), dist.isend(x, nxt)]
        for w in works:
            w.wait()  # s waits for the exchange
        got = y * 1  # a kernel on s
    torch.cuda.current_stream().wait_stream(s)
    check("exchange on a side stream", got, _p2p_message(prv, me, 1 << 20, torch.float32, 4))

    ins, outs = [me + j + 1 for j in range(P)], [q + me + 1 for q in range(P)]  # uneven: one engine batch
    x = torch.cat([torch.arange(n) + 1000 * me + 100 * j for j, n in enumerate(ins)]).cuda()
    y = torch.full((sum(outs),), -1, dtype=torch.int64, device="cuda")
    dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins)
    check("uneven all_to_all_single", y, torch.cat([torch.arange(n) + 1000 * q + 100 * me for q, n in enumerate(outs)]))

    # gather (a CUDA list, then a CPU list of transposed tensors), scatter from a CPU list, and the
    # list all_to_all of uneven blocks: one engine batch each from C++ (device_lists.cc)
    before = _C.device_native_p2p_count()
    x = (torch.arange(12.0) + 100 * me).view(3, 4)
    for where in ("cuda", "cpu"):
        lst = [torch.zeros(4, 3, device=where).t() for _ in range(P)] if me == P - 1 else None
        dist.gather(x.cuda(), lst, dst=P - 1)
        for q in range(P if me == P - 1 else 0):
            check(f"gather into a {where} list, block {q}", lst[q], (torch.arange(12.0) + 100 * q).view(3, 4))
    y = torch.zeros(5, device="cuda")
    dist.scatter(y, [torch.arange(5.0) + 10 * j for j in range(P)] if me == 0 else None, src=0)
    check("scatter from a CPU list", y, torch.arange(5.0) + 10 * me)
    ins = [(torch.arange(me + 2 * j + 1) + 1000 * me + 100 * j).cuda() for j in range(P)]
    outs = [torch.full((q + 2 * me + 1,), -1, dtype=torch.int64, device="cuda") for q in range(P)]
    dist.all_to_all(outs, ins)
    for q in range(P):
        check(f"list all_to_all from {q}", outs[q], torch.arange(q + 2 * me + 1) + 1000 * q + 100 * me)
    if native.load() is not None and _C.device_native_p2p_count() - before != 4:
        failures.append(f"gather/scatter/all_to_all: {_C.device_native_p2p_count() - before} batches from C++, not 4")

    try:
        dist.recv(torch.zeros(1, device="cuda"))
        failures.append("recv without src on a CUDA tensor was not refused")
    except ValueError as e:
        if not str(e).startswith("src:"):
            failures.append(f"recv without src: the error does not name src: {e}")
    torch.cuda.synchronize()
    if native.load() is not None and _C.device_native_p2p_count() - cpp_batches < 20:  # (of its ~40 batches)
        failures.append(f"only {_C.device_native_p2p_count() - cpp_batches} CUDA batches ran from the C++ backend")
    return failures
