"""Rank side of test_cuda_backend.py's staged-call test (@gpu): CUDA calls the backend stages
(docs/torch_backend.md, "What stays on the Python path": non-contiguous tensors, dtypes and ops the
core does not reduce, conjugate views, equal-block all_to_all_single) against gloo on CPU copies of
the same data in the same processes, blocking and async; uneven all_gather lists,
all_gather_coalesced and coalescing-manager blocks with a tensor to stage against every rank's data
(_compare_lists). The C++ backend stages them (csrc/torch_backend/staging.h, on the current stream:
device_staged.cc): after one warm-up call on the stream (the first call on a group and
stream is the Python route's), a spy on every method of the Python backend must see none of them.
Integers and booleans exact; float32 and complex64 at rtol 1e-5 / atol 1e-6 (gloo reduces in another
order). ``device="cpu"`` runs the same checks on CPU tensors (how the case itself was checked without a
GPU). Returns the failures (empty: all good)."""
from __future__ import annotations

import torch
import torch.distributed as dist

import backend_cases as bc
from native_call_cases import handed_over

RTOL, ATOL = 1e-5, 1e-6


def _data(shape, dtype, salt, me):
    g = torch.Generator().manual_seed(1000 * salt + me)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


def _same(got, want):
    got = got.cpu()
    if got.is_floating_point() or got.is_complex():
        return torch.allclose(got, want, rtol=RTOL, atol=ATOL)
    return torch.equal(got, want)


def _calls(P):
    """(name, dtype, input shape, output shape or None, fn(x, out, group, async_op), strided): every
    staged form; `strided` makes the tensor a transposed (non-contiguous) view."""
    S = dist.ReduceOp
    return [
        ("all_reduce", torch.float32, (6, 5), None, lambda x, o, g, a: dist.all_reduce(x, group=g, async_op=a), True),
        ("all_reduce max", torch.int16, (7,), None,
         lambda x, o, g, a: dist.all_reduce(x, op=S.MAX, group=g, async_op=a), False),
        ("all_reduce", torch.int16, (4, 3), None, lambda x, o, g, a: dist.all_reduce(x, group=g, async_op=a), True),
        ("all_reduce bor", torch.bool, (9,), None,
         lambda x, o, g, a: dist.all_reduce(x, op=S.BOR, group=g, async_op=a), False),
        ("all_reduce", torch.complex64, (5,), None, lambda x, o, g, a: dist.all_reduce(x, group=g, async_op=a), False),
        ("reduce", torch.float32, (3, 8), None, lambda x, o, g, a: dist.reduce(x, dst=P - 1, group=g, async_op=a),
         True),
        ("broadcast", torch.float32, (5, 4), None, lambda x, o, g, a: dist.broadcast(x, src=0, group=g, async_op=a),
         True),
        ("broadcast", torch.int16, (11,), None, lambda x, o, g, a: dist.broadcast(x, src=P - 1, group=g, async_op=a),
         False),
        ("all_gather_into_tensor", torch.float32, (4, 3), (4 * P, 3),
         lambda x, o, g, a: dist.all_gather_into_tensor(o, x.t().contiguous().t(), group=g, async_op=a), True),
        ("reduce_scatter_tensor", torch.float32, (3 * P, 2), (3, 2),
         lambda x, o, g, a: dist.reduce_scatter_tensor(o, x, group=g, async_op=a), True),
        ("reduce_scatter_tensor", torch.int16, (2 * P,), (2,),
         lambda x, o, g, a: dist.reduce_scatter_tensor(o, x, group=g, async_op=a), False),
        # the list forms: outputs (inputs) are transposed views of one tensor's blocks
        ("all_gather", torch.float32, (3, 4), (P, 4, 3),
         lambda x, o, g, a: dist.all_gather([v.t() for v in o.unbind(0)], x, group=g, async_op=a), True),
        ("reduce_scatter", torch.float32, (P, 3, 2), (3, 2),
         lambda x, o, g, a: dist.reduce_scatter(o.t(), [v.t() for v in x.unbind(0)], group=g, async_op=a), False),
        # equal-block all_to_all_single of a transposed input (complex: torch passes its real view)
        ("all_to_all_single", torch.float32, (2 * P, 3), (2 * P, 3),
         lambda x, o, g, a: dist.all_to_all_single(o, x, group=g, async_op=a), True),
        ("all_to_all_single", torch.complex64, (P, 2), (P, 2),
         lambda x, o, g, a: dist.all_to_all_single(o, x, group=g, async_op=a), True),
    ]


def case_cuda_staged(comm, device="cuda"):
    st = bc.setup(comm)
    gloo, P, me = st["gloo"], comm.size, comm.rank
    failures = []
    if device == "cuda":  # the first call on this group and stream: the Python route sets it up
        dist.all_reduce(torch.ones(4, device=device))
    with handed_over() as seen:
        _compare(gloo, P, me, device, failures)
        _compare_lists(P, me, device, failures)
    if seen:
        failures.append(f"handed to the Python backend: {seen}")
    _bad_arguments(P, me, device, failures)
    if device == "cuda":
        torch.cuda.synchronize()
    return failures


def _compare(gloo, P, me, device, failures):
    for salt, (name, dtype, shape, out_shape, fn, strided) in enumerate(_calls(P)):
        def make(on):
            x = _data(shape[::-1] if strided else shape, dtype, salt, me).to(on)
            x = x.t() if strided else x  # (a transposed view: not contiguous)
            o = None if out_shape is None else torch.zeros(out_shape, dtype=dtype, device=on)
            return x, o
        x_cpu, o_cpu = make("cpu")
        # gloo has no int16 or bool reduction: it reduces int32 / uint8 copies (exact), cast back
        as_gloo = {torch.int16: torch.int32, torch.bool: torch.uint8}.get(dtype, dtype)
        x_g = x_cpu.to(as_gloo).contiguous()  # (gloo reads some calls' inputs as they lie)
        o_g = None if o_cpu is None else o_cpu.to(as_gloo)
        fn(x_g, o_g, gloo, False)
        want = (x_g if o_g is None else o_g).to(dtype)
        for mode in ("blocking", "async"):
            x, o = make(device)
            w = fn(x, o, None, mode == "async")
            if w is not None:
                w.wait()  # (the current stream waits for the call and its copies back)
            got = (x if o is None else o).clone()  # a kernel on the current stream
            if name == "reduce" and me != P - 1:
                continue  # reduce leaves non-roots' buffers unspecified
            if not _same(got, want):
                failures.append(f"{name} {dtype} {'strided' if strided else ''} {mode}: {got.flatten()[:4].tolist()} "
                                f"expected {want.flatten()[:4].tolist()}")


def _compare_lists(P, me, device, failures):
    """The list and coalesced forms gloo cannot check (uneven lists) or that run one call per tensor on
    CUDA: an uneven all_gather list, all_gather_coalesced, and coalescing-manager blocks with a tensor
    to stage, each against every rank's data (_data is the same on every rank), blocking and async."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    every = lambda shape, dtype, salt: [_data(shape, dtype, salt, q) for q in range(P)]  # noqa: E731

    def check(name, got, want):
        if not _same(got, want):
            failures.append(f"{name}: {got.flatten()[:4].tolist()} expected {want.flatten()[:4].tolist()}")

    for mode in ("blocking", "async"):
        a = mode == "async"
        # all_gather, uneven: rank q's block has 2q + 1 int16, this rank's input strided
        xs = [_data((2 * q + 1,), torch.int16, 40 + q, 0) for q in range(P)]
        x = torch.stack([xs[me], xs[me]], 1).to(device)[:, 0]
        outs = list(torch.zeros(sum(2 * q + 1 for q in range(P)), dtype=torch.int16, device=device)
                    .split([2 * q + 1 for q in range(P)]))
        w = dist.all_gather(outs, x, async_op=a)
        if w is not None:
            w.wait()
        check(f"all_gather uneven {mode}", torch.cat(outs), torch.cat(xs))
        # all_gather_coalesced (torch takes one dtype): an int16 of 3 and a transposed one
        f, i16 = every((3,), torch.int16, 44), every((2, 3), torch.int16, 45)
        ins = [f[me].to(device), i16[me].t().contiguous().to(device).t()]
        outl = [[torch.zeros(3, dtype=torch.int16, device=device), torch.zeros(2, 3, dtype=torch.int16, device=device)]
                for _ in range(P)]
        w = dist.all_gather_coalesced(outl, ins, async_op=a)
        if w is not None:
            w.wait()
        check(f"all_gather_coalesced int16 {mode}", torch.stack([o[0] for o in outl]), torch.stack(f))
        check(f"all_gather_coalesced int16 transposed {mode}", torch.stack([o[1] for o in outl]), torch.stack(i16))
        # coalesced all_reduce: a transposed float32 and an int16 max (staged), a plain float32
        t32, m16, p32 = every((4, 3), torch.float32, 46), every((5,), torch.int16, 47), every((6,), torch.float32, 48)
        ts = [t32[me].t().contiguous().to(device).t(), m16[me].clone().to(device), p32[me].clone().to(device)]
        with _coalescing_manager(async_ops=a) as cm:
            dist.all_reduce(ts[0], async_op=a)
            dist.all_reduce(ts[2], async_op=a)
        if a:
            cm.wait()
        with _coalescing_manager(async_ops=a) as cm:
            dist.all_reduce(ts[1], op=dist.ReduceOp.MAX, async_op=a)
        if a:
            cm.wait()
        check(f"coalesced all_reduce transposed {mode}", ts[0], sum(t32))
        check(f"coalesced all_reduce int16 max {mode}", ts[1], torch.stack(m16).max(0).values)
        check(f"coalesced all_reduce plain {mode}", ts[2], sum(p32))
        # coalesced all_gather_into_tensor and reduce_scatter_tensor into transposed outputs
        g = every((3, 2), torch.float32, 49)
        og = torch.zeros(2, 3 * P, device=device).t()
        rs = every((2 * P, 3), torch.float32, 50)
        ors = torch.zeros(3, 2, device=device).t()
        with _coalescing_manager(async_ops=a) as cm:
            dist.all_gather_into_tensor(og, g[me].to(device), async_op=a)
        if a:
            cm.wait()
        with _coalescing_manager(async_ops=a) as cm:
            dist.reduce_scatter_tensor(ors, rs[me].to(device), async_op=a)
        if a:
            cm.wait()
        check(f"coalesced all_gather_into_tensor {mode}", og, torch.cat(g))
        check(f"coalesced reduce_scatter_tensor {mode}", ors, sum(rs)[2 * me: 2 * me + 2])


def _bad_arguments(P, me, device, failures):
    """The new staged forms with a bad argument, declined by the builders and named by the Python side:
    an uneven all_gather whose own output block is not its input's size, an all_to_all_single of
    3P + 1 elements (no equal blocks). Then one right call, so that nothing was left half-run."""
    x = torch.zeros(me + 2, dtype=torch.int16, device=device)
    outs = [torch.zeros(q + 1, dtype=torch.int16, device=device) for q in range(P)]
    bad_a2a = torch.zeros(2 * (3 * P + 1), device=device)[::2]
    for name, call, names in (("all_gather", lambda: dist.all_gather(outs, x), "output_tensor_list"),
                              # (both sides are bad: the output is named first, as the Python backend does)
                              ("all_to_all_single", lambda: dist.all_to_all_single(bad_a2a, bad_a2a), "output:")):
        try:
            call()
            failures.append(f"{name} with a bad argument: no error")
        except (ValueError, RuntimeError) as e:
            if names not in str(e):
                failures.append(f"{name} with a bad argument: {e!r} does not name {names!r}")
    t = torch.full((3,), me + 1, dtype=torch.int16, device=device)[::1]
    dist.all_reduce(t)
    if t.tolist() != [P * (P + 1) // 2] * 3:
        failures.append(f"all_reduce after the bad arguments: {t.tolist()}")
