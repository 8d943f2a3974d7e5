"""Rank side of test_cuda_staged_emulated.py: the C++ backend's staged CUDA calls (staging.h's
builders, device_staged.cc's device_staged) driven with ``commlib.emulated`` memory through the test
seam ``CommlibBackend._staged_device_call`` (torch's CPU build has no CUDA tensor): the caller's
tensors are torch views over emulated memory (transposed, strided, of dtypes the core does not
reduce, conjugate), the staged buffers emulated memory too. After the set-up call (the first on the
stream goes through the Python route), every staged call must run from C++ as a new shape, with a
spy on the Python device route seeing none. Values are exact: integers, booleans, and float32 /
complex64 sums of small integers (exact in any order)."""
from __future__ import annotations

import numpy as np
import torch

import commlib.emulated as emu
from commlib import _C
from commlib.torch import native

from native_new_shape_cases import Offers


class Memory:
    """Emulated memory as torch CPU views (what the seam takes for CUDA tensors), and the staged
    buffers' allocator (counted)."""

    def __init__(self):
        self.arrays = []
        self.allocated = 0

    def alloc(self, nbytes):
        self.allocated += 1
        return emu.empty(nbytes, "uint8")

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``t`` in emulated memory, as a torch view of it."""
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(1, np.uint8)
        arr = emu.from_numpy(np.ascontiguousarray(raw))
        self.arrays.append(arr)
        emu.current_stream().synchronize()  # (the seam's copies in run on the host)
        host = native.load()._host_tensor(arr.data_ptr(), arr.nbytes)
        return host[: t.numel() * t.element_size()].view(t.dtype).view(t.shape)


def _data(shape, dtype, salt, rank):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    small = torch.randint(-20, 20, shape, generator=g)
    if dtype.is_complex:
        return torch.complex(small.float(), torch.randint(-20, 20, shape, generator=g).float()).to(dtype)
    return small.to(dtype)


def _every(P, shape, dtype, salt):
    return [_data(shape, dtype, salt, q) for q in range(P)]


def _cases(P, r):
    """(name, kind, outputs, inputs, op, root, check): every staged form, each on views the core
    cannot take as they lie; `check()` -> None or what is wrong. Tensors are made by `m.tensor`."""
    out = []

    def add(name, kind, make, op="sum", root=0):
        out.append((name, kind, make, op, root))

    # all_reduce: a transposed float32, int16 max (in int64), a transposed int16 sum, bool bor (as
    # uint8 max), complex64 sum (pairs of reals), a conjugate view, a strided int16 of 13 (prime)
    def transposed_f32(m, salt=0):
        xs = [x.t() for x in _every(P, (5, 6), torch.float32, salt)]
        t = m.tensor(xs[r].t().contiguous()).t()  # (6, 5) view of a (5, 6) buffer: not contiguous
        return [], [t], lambda: t.clone(), sum(xs)
    add("all_reduce float32 transposed", "all_reduce", transposed_f32)

    def int16_max(m):
        xs = _every(P, (7,), torch.int16, 1)
        t = m.tensor(xs[r])
        return [], [t], lambda: t.clone(), torch.stack(xs).max(0).values
    add("all_reduce int16 max", "all_reduce", int16_max, op="max")

    def int16_sum_t(m):
        xs = [x.t() for x in _every(P, (4, 3), torch.int16, 2)]
        t = m.tensor(xs[r].t().contiguous()).t()
        return [], [t], lambda: t.clone(), torch.stack([x.long() for x in xs]).sum(0).to(torch.int16)
    add("all_reduce int16 transposed", "all_reduce", int16_sum_t)

    def bool_bor(m):
        xs = _every(P, (9,), torch.bool, 3)
        t = m.tensor(xs[r])
        return [], [t], lambda: t.clone(), torch.stack(xs).any(0)
    add("all_reduce bool bor", "all_reduce", bool_bor, op="bor")

    def complex_sum(m):
        xs = _every(P, (5,), torch.complex64, 4)
        t = m.tensor(xs[r])
        return [], [t], lambda: t.clone(), sum(xs)
    add("all_reduce complex64", "all_reduce", complex_sum)

    def complex_conj(m):
        xs = _every(P, (6,), torch.complex64, 5)
        t = m.tensor(xs[r]).conj()  # the view reads conj(x); its result is the sum of every conj(x)
        return [], [t], lambda: t.resolve_conj().clone(), sum(x.conj() for x in xs).resolve_conj()
    add("all_reduce complex64 conj view", "all_reduce", complex_conj)

    def strided_prime(m):
        xs = _every(P, (26,), torch.int16, 6)
        t = m.tensor(xs[r])[::2]  # 13 elements, stride 2
        return [], [t], lambda: t.clone(), torch.stack([x[::2].long() for x in xs]).sum(0).to(torch.int16)
    add("all_reduce int16 strided 13", "all_reduce", strided_prime)

    def one_element(m):
        xs = _every(P, (2,), torch.int16, 7)
        t = m.tensor(xs[r])[1:]  # one element, at an offset
        return [], [t], lambda: t.clone(), torch.stack([x[1:].long() for x in xs]).sum(0).to(torch.int16)
    add("all_reduce int16 one element", "all_reduce", one_element)

    # reduce to the last rank (only the root's result is defined)
    def reduce_t(m):
        xs = [x.t() for x in _every(P, (8, 3), torch.int16, 8)]
        t = m.tensor(xs[r].t().contiguous()).t()
        want = torch.stack([x.long() for x in xs]).sum(0).to(torch.int16) if r == P - 1 else None
        return [], [t], lambda: t.clone(), want
    add("reduce int16 transposed", "reduce", reduce_t, root=P - 1)

    # broadcast: a transposed float32 from rank 0, a strided int16 (moved as bytes) from the last
    def bcast_t(m):
        xs = [x.t() for x in _every(P, (4, 5), torch.float32, 9)]
        t = m.tensor(xs[r].t().contiguous()).t()
        return [], [t], lambda: t.clone(), xs[0]
    add("broadcast float32 transposed", "broadcast", bcast_t, root=0)

    def bcast_s(m):
        xs = _every(P, (22,), torch.int16, 10)
        t = m.tensor(xs[r])[::2]
        return [], [t], lambda: t.clone(), xs[P - 1][::2]
    add("broadcast int16 strided", "broadcast", bcast_s, root=P - 1)

    # all_gather_into_tensor: a transposed input into a transposed output
    def ag_base(m):
        xs = [x.t() for x in _every(P, (3, 4), torch.float32, 11)]
        i = m.tensor(xs[r].t().contiguous()).t()  # (4, 3)
        o = m.tensor(torch.zeros(3, 4 * P)).t()  # (4P, 3), not contiguous
        return [o], [i], lambda: o.clone(), torch.cat(xs, 0)
    add("all_gather_into_tensor transposed", "all_gather_into_tensor", ag_base)

    # reduce_scatter_tensor: a strided int16 input (in int64), a strided output
    def rs_base(m):
        xs = _every(P, (4 * P,), torch.int16, 12)
        i = m.tensor(xs[r])[::2]  # 2P elements
        o = m.tensor(torch.zeros(4, dtype=torch.int16))[::2]
        total = torch.stack([x[::2].long() for x in xs]).sum(0).to(torch.int16)
        return [o], [i], lambda: o.clone(), total[2 * r: 2 * r + 2]
    add("reduce_scatter_tensor int16 strided", "reduce_scatter_tensor", rs_base)

    # reduce_scatter with a list: uneven blocks (rank j's has 2 + j elements, padded), transposed
    # float32 where a block is 2-D; the output strided
    def rs_list(m):
        every = [[_data((2 + j,), torch.float32, 13 + j, q) for j in range(P)] for q in range(P)]
        ins = [m.tensor(b) for b in every[r]]
        ins[0] = m.tensor(torch.stack([every[r][0], every[r][0]], 1)).t()[0]  # a strided view of block 0
        o = m.tensor(torch.zeros(2 * (2 + r)))[::2]
        return [o], ins, lambda: o.clone(), sum(every[q][r] for q in range(P))
    add("reduce_scatter list uneven", "reduce_scatter", rs_list)

    # all_gather with a list: a contiguous int16 input (moved as bytes) into transposed outputs
    def ag_list(m):
        xs = _every(P, (3, 2), torch.int16, 14)
        i = m.tensor(xs[r])
        outs = [m.tensor(torch.zeros(2, 3, dtype=torch.int16)).t() for _ in range(P)]
        return outs, [i], lambda: torch.stack([o.clone() for o in outs]), torch.stack(xs)
    add("all_gather list transposed", "all_gather", ag_list)

    # all_gather with an uneven list: rank j's block has 3j int16 (rank 0's empty), each rank's
    # input strided, the outputs strided; then 2j + 1 complex64 (moved as bytes), a conjugate input
    def ag_uneven(m):
        xs = [_data((3 * j,), torch.int16, 15, j) for j in range(P)]
        i = m.tensor(torch.stack([xs[r], xs[r]], 1))[:, 0]  # 3r elements, stride 2
        outs = [m.tensor(torch.zeros(6 * j, dtype=torch.int16))[::2] for j in range(P)]
        return outs, [i], lambda: torch.cat([o.clone() for o in outs]), torch.cat(xs)
    add("all_gather uneven list strided", "all_gather", ag_uneven)

    def ag_uneven_conj(m):
        xs = [_data((2 * j + 1,), torch.complex64, 16, j) for j in range(P)]
        i = m.tensor(xs[r].conj().resolve_conj()).conj()  # a conjugate view that reads xs[r]
        outs = [m.tensor(torch.zeros(2 * j + 1, dtype=torch.complex64)) for j in range(P)]
        return outs, [i], lambda: torch.cat([o.clone() for o in outs]), torch.cat(xs)
    add("all_gather uneven list conj", "all_gather", ag_uneven_conj)

    # all_to_all_single with equal blocks: a transposed (2P, 3) float32 into a transposed output
    # (two rows a block); one int16 a block, both strided; int32 in place (contiguous: sent from a
    # copy; the emulated engine's all_to_all is right in place without it too, so this checks the result only)
    def a2a_t(m):
        xs = [_data((3, 2 * P), torch.float32, 17, q).t() for q in range(P)]
        i = m.tensor(xs[r].t().contiguous()).t()
        o = m.tensor(torch.zeros(3, 2 * P)).t()
        return [o], [i], lambda: o.clone(), torch.cat([xs[j][2 * r: 2 * r + 2] for j in range(P)])
    add("all_to_all_single transposed", "all_to_all_single", a2a_t)

    def a2a_one(m):
        xs = _every(P, (2 * P,), torch.int16, 18)
        i = m.tensor(xs[r])[::2]
        o = m.tensor(torch.zeros(2 * P, dtype=torch.int16))[1::2]
        return [o], [i], lambda: o.clone(), torch.stack([xs[j][::2][r] for j in range(P)])
    add("all_to_all_single one element a block", "all_to_all_single", a2a_one)

    def a2a_in_place(m):
        xs = _every(P, (5 * P,), torch.int32, 19)
        t = m.tensor(xs[r])
        return [t], [t], lambda: t.clone(), torch.cat([xs[j][5 * r: 5 * r + 5] for j in range(P)])
    add("all_to_all_single in place", "all_to_all_single", a2a_in_place)

    # Session 27: an expanded view (one element stored for all) as the input of all_to_all_single,
    # an all_gather list (equal and uneven) and a reduce_scatter list whose blocks (uneven) are int32
    # into a float32 output (cast): read through a copy, as the Python side reads them
    def value(q, j=0):
        return 10 * q + j + 1

    def a2a_expanded(m):
        i = m.tensor(torch.tensor([float(value(r))])).expand(2 * P)
        o = m.tensor(torch.zeros(2 * P))
        return [o], [i], lambda: o.clone(), torch.tensor([float(value(j)) for j in range(P) for _ in range(2)])
    add("all_to_all_single expanded input", "all_to_all_single", a2a_expanded)

    def ag_list_expanded(m):
        i = m.tensor(torch.tensor([value(r)], dtype=torch.int16)).expand(3)
        outs = [m.tensor(torch.zeros(3, dtype=torch.int16)) for _ in range(P)]
        return outs, [i], lambda: torch.stack([o.clone() for o in outs]), torch.tensor(
            [[value(j)] * 3 for j in range(P)], dtype=torch.int16)
    add("all_gather list expanded input", "all_gather", ag_list_expanded)

    def ag_uneven_expanded(m):
        i = m.tensor(torch.tensor([value(r)], dtype=torch.int64)).expand(r + 1)
        outs = [m.tensor(torch.zeros(j + 1, dtype=torch.int64)) for j in range(P)]
        return outs, [i], lambda: torch.cat([o.clone() for o in outs]), torch.cat(
            [torch.full((j + 1,), value(j)) for j in range(P)])
    add("all_gather uneven list expanded input", "all_gather", ag_uneven_expanded)

    def rs_list_cast(m):
        ins = [m.tensor(torch.tensor([value(r, j)], dtype=torch.int32)).expand(2 + j) for j in range(P)]
        o = m.tensor(torch.zeros(2 + r))
        return [o], ins, lambda: o.clone(), torch.full((2 + r,), float(sum(value(q, r) for q in range(P))))
    add("reduce_scatter list uneven int32 expanded into float32", "reduce_scatter", rs_list_cast)
    return out


def staged_calls_run_from_cpp(comm):
    """After the set-up call, every staged form through the seam: (declined or wrong, the Python
    route's calls, staged calls run from C++ as new shapes, calls made)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    m = Memory()
    first = emu.from_numpy(np.full(8, r + 1, np.float32))
    o.call("all_reduce", first).synchronize()  # set-up: the engine, the stream's wrapper
    stream = _C.emulated_current_stream()
    new0 = _C.device_native_new_shape_count()
    bad = []
    cases = _cases(P, r)
    for name, kind, make, op, root in cases:
        outs, ins, result, want = make(m)
        w = o.backend._staged_device_call(kind, outs, ins, op, root, 0, stream, m.alloc)
        if w is None:
            bad.append(f"{name}: declined")
            continue
        w.wait()
        w.synchronize()
        got = result()
        if want is not None and not torch.equal(got, want.to(got.dtype)):
            bad.append(f"{name}: {got.flatten()[:6].tolist()} expected {want.flatten()[:6].tolist()}")
    new = _C.device_native_new_shape_count() - new0
    o.shutdown()
    return bad, o.python_calls, new, len(cases)


def staged_bad_arguments(comm):
    """A staged call with a bad argument, on a set-up stream: a reduce from a root out of range, a
    reduce_scatter_tensor of two dtypes, an all_to_all_single of 3P + 1 elements (no equal blocks)
    and of two dtypes, an uneven all_gather whose own output block is not its input's size and one
    with an output of another dtype are declined by the builders, and the backend raises the
    Python backend's error itself (argument_errors.h: "Type: message" of each); a max of complex
    tensors raises ValueError naming `op` from the builder; none of them made a staged buffer or a
    device call (no new shape counted), and a staged all_reduce after them is right on every rank.
    Returns (what each bad call raised, the error, buffers made, new shapes counted, whether the
    later call is right)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    m = Memory()
    o.call("all_reduce", emu.from_numpy(np.ones(8, np.float32))).synchronize()  # set-up
    stream = _C.emulated_current_stream()
    x = m.tensor(torch.arange(12, dtype=torch.int16).view(3, 4)).t()
    out16 = m.tensor(torch.zeros(4, dtype=torch.int16))[::2]
    in32 = m.tensor(torch.zeros(4 * P, dtype=torch.float32))[::2]
    z = m.tensor(torch.ones(4, dtype=torch.complex64))[::2]
    new0, made0 = _C.device_native_new_shape_count(), m.allocated
    a2a_in = m.tensor(torch.zeros(2 * (3 * P + 1), dtype=torch.int16))[::2]  # 3P + 1: no equal blocks
    a2a_out = m.tensor(torch.zeros(2 * (3 * P + 1), dtype=torch.int16))[::2]
    uneven = [m.tensor(torch.zeros(2 * (j + 1), dtype=torch.int16))[::2] for j in range(P)]
    def raised(*args):
        try:
            return o.backend._staged_device_call(*args, 0, stream, m.alloc)
        except (TypeError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
    seam = [raised("reduce", [], [x], "sum", P),
            raised("reduce_scatter_tensor", [out16], [in32], "sum", 0),
            raised("all_to_all_single", [a2a_out], [a2a_in], "sum", 0),
            raised("all_to_all_single", [in32], [x.reshape(-1)[: 2 * P]], "sum", 0),
            # this rank's output block is not its input's size; then one of another dtype
            raised("all_gather", uneven, [x[:, 0][: r + 2]], "sum", 0),
            raised("all_gather", uneven[:-1] + [in32[: P]], [uneven[r]], "sum", 0)]
    error = "no error"
    try:
        o.backend._staged_device_call("all_reduce", [], [z], "max", 0, 0, stream, m.alloc)
    except ValueError as e:
        error = f"ValueError: {e}"
    made, counted = m.allocated - made0, _C.device_native_new_shape_count() - new0
    y = m.tensor(torch.full((3, 5), r + 1, dtype=torch.int16)).t()
    w = o.backend._staged_device_call("all_reduce", [], [y], "sum", 0, 0, stream, m.alloc)
    w.synchronize()
    right = bool(torch.equal(y, torch.full((5, 3), P * (P + 1) // 2, dtype=torch.int16)))
    o.shutdown()
    return seam, error, made, counted, right
