"""Rank side of test_cuda_backend.py's new-shape test (@gpu): CUDA tensors made fresh every step, as
training makes activations and gradients, through ``torch.distributed`` on the C++ backend. After
the first call on the group and device (which sets the engine up from C++: a spy on the Python backend
sees it neither, csrc/bindings/device_engines.h), every call is
a shape the device call cache never held, checked and resolved in C++
(csrc/bindings/device_call_new_shape.cc) and run from there, every other step on side streams no
call ran on before (wrapped in C++: csrc/bindings/device_p2p_streams.h): a spy on the Python
backend's methods sees none of them. Integers, exact. Returns the failures (empty: all good)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from native_call_cases import handed_over
from torch_cuda_cases import _cuda_setup


def _step(k, P, me, failures):
    """Every collective the C++ backend runs on CUDA tensors, on tensors made now (sizes change with
    `k`: 0, 1, primes, more than the world size), checked exactly."""
    n = (0, 1, 13, 1000, 4099)[k % 5]
    base = torch.arange(n, device="cuda", dtype=torch.int64) % 7
    S = P * (P - 1) // 2

    def check(what, got, want):
        if not torch.equal(got.cpu(), want.cpu()):
            failures.append(f"step {k} {what} (n={n}): {got.cpu()[:4].tolist()} expected {want.cpu()[:4].tolist()}")
    x = base + me
    dist.all_reduce(x)
    check("all_reduce", x, P * base + S)
    y = (base * (me + 1)).to(torch.int32)
    dist.all_reduce(y, op=dist.ReduceOp.MAX, async_op=True).wait()
    check("all_reduce max", y, (base * P).to(torch.int32))
    z = base + 1000 * me
    dist.broadcast(z, src=k % P)
    check("broadcast", z, base + 1000 * (k % P))
    gathered = torch.empty(n * P, device="cuda", dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, base + 10 * me)
    check("all_gather_into_tensor", gathered, torch.cat([base + 10 * q for q in range(P)]))
    scattered = torch.empty(n, device="cuda", dtype=torch.int64)
    dist.reduce_scatter_tensor(scattered, base.repeat(P) + me)
    check("reduce_scatter_tensor", scattered, P * base + S)
    a2a = torch.empty(n * P, device="cuda", dtype=torch.int64)
    dist.all_to_all_single(a2a, torch.cat([base + 100 * me + 10 * j for j in range(P)]))
    check("all_to_all_single", a2a, torch.cat([base + 100 * q + 10 * me for q in range(P)]))
    v = base + me
    dist.reduce(v, dst=(k + 1) % P)
    if me == (k + 1) % P:
        check("reduce", v, P * base + S)


def case_cuda_fresh_tensors_from_cpp(comm, steps=10):
    from commlib import _C
    _cuda_setup(comm)
    P, me = comm.size, comm.rank
    failures = []
    first = torch.ones(8, device="cuda")
    with handed_over() as seen_first:
        dist.all_reduce(first)  # the first call on this group and device: its engine set up from C++
    torch.cuda.synchronize()
    if seen_first:
        failures.append(f"the first call was handed to the Python backend: {seen_first}")
    if not torch.equal(first.cpu(), torch.full((8,), float(P))):
        failures.append(f"the first all_reduce: {first.cpu()[:4].tolist()} expected {P}")
    new0, wrapped0 = _C.device_native_new_shape_count(), _C.device_native_stream_count()
    sides = [torch.cuda.Stream() for _ in range(2)]
    with handed_over() as seen:
        for k in range(steps):
            if k % 2:  # a side stream per step, as a side stream per bucket
                with torch.cuda.stream(sides[k // 2 % 2]):
                    _step(k, P, me, failures)
            else:
                _step(k, P, me, failures)
        torch.cuda.synchronize()
    if seen:
        failures.append(f"the C++ backend handed {len(seen)} calls to the Python backend: {seen[:8]}")
    new = _C.device_native_new_shape_count() - new0
    if _C.device_native_stream_count() - wrapped0 != len(sides):
        failures.append(f"C++ wrapped {_C.device_native_stream_count() - wrapped0} streams, expected {len(sides)}")
    if new < steps * 7 - 7:  # (the allocator may hand a tensor the memory of an earlier step's)
        failures.append(f"{new} new shapes ran from C++ in {steps * 7} calls on fresh tensors")
    return failures
