"""Rank-side checks that the C++ fast path (plain NumPy arrays, blocking) and the general Python
path (here forced with an ndarray subclass, and with async_op=True) give identical results."""
from __future__ import annotations

import numpy as np

import commlib._C as _C


class Sub(np.ndarray):
    """An ndarray subclass: the fast path declines it, the general path accepts it."""


def _run_way(comm, name, make_args, way):
    """Run collective `name` on fresh buffers one way; return a copy of its output (or None)."""
    args, kwargs, result = make_args()
    if way == "general":
        args = [a.view(Sub) if isinstance(a, np.ndarray) else a for a in args]
    if way == "async":
        kwargs = dict(kwargs, async_op=True)
    work = getattr(comm, name)(*args, **kwargs)
    if way == "async":
        work.wait()
    else:
        assert work is None
    out = result()
    return None if out is None else np.asarray(out).copy()


def check_paths_agree(comm):
    P, r = comm.size, comm.rank
    rng = np.random.default_rng(1234 + r)
    failures = []

    def data(n, dtype=np.int32):
        return rng.integers(-1000, 1000, n).astype(dtype)

    cases = []
    for n in (0, 1, 7, 1031):
        for op in ("sum", "max", "bxor"):
            def ar(n=n, op=op):
                x = data(n)
                return [x], {"op": op}, lambda: x
            cases.append(("all_reduce", ar))

            def ar_out(n=n, op=op):
                x, o = data(n), np.zeros(n, np.int32)
                return [x], {"op": op, "out": o}, lambda: o
            cases.append(("all_reduce", ar_out))

            def rs(n=n, op=op):
                x, o = data(n * P), np.zeros(n, np.int32)
                return [o, x], {"op": op}, lambda: o
            cases.append(("reduce_scatter", rs))

            for root in range(P):
                def red(n=n, op=op, root=root):
                    x, o = data(n), np.zeros(n, np.int32)
                    return [x], {"op": op, "root": root, "out": o}, lambda: o if r == root else None
                cases.append(("reduce", red))

        def premul(n=n):
            x = data(n, np.float64)
            return [x], {"op": "premul_sum", "scale": 0.5}, lambda: x
        cases.append(("all_reduce", premul))

        def ag(n=n):
            x, o = data(n), np.zeros(n * P, np.int32)
            return [o, x], {}, lambda: o
        cases.append(("all_gather", ag))

        def a2a(n=n):
            x, o = data(n * P, np.float32), np.zeros(n * P, np.float32)
            return [o, x], {}, lambda: o
        cases.append(("all_to_all", a2a))

        for root in range(P):
            def bc(n=n, root=root):
                x = data(n, np.int64)
                return [x], {"root": root}, lambda: x
            cases.append(("broadcast", bc))

            def ga(n=n, root=root):
                x = data(n)
                o = np.zeros(n * P, np.int32) if r == root else None
                return [o, x], {"root": root}, lambda: o
            cases.append(("gather", ga))

            def sc(n=n, root=root):
                x = data(n * P) if r == root else None
                o = np.zeros(n, np.int32)
                return [o, x], {"root": root}, lambda: o
            cases.append(("scatter", sc))

    for name, make_args in cases:
        state = rng.bit_generator.state
        outs = []
        for way in ("fast", "general", "async"):
            rng.bit_generator.state = state  # the same inputs every way
            outs.append(_run_way(comm, name, make_args, way))
        fast, general, async_ = outs
        if fast is None:
            if general is not None or async_ is not None:
                failures.append(f"{name}: output presence differs")
            continue
        if not (np.array_equal(fast, general) and np.array_equal(fast, async_)):
            failures.append(f"{name} (n={fast.size}): fast {fast[:4]} general {general[:4]} async {async_[:4]}")
    return failures


def fast_path_taken(comm):
    """The common blocking cases must not fall back (that would be a silent slowdown)."""
    P, r = comm.size, comm.rank
    addr = comm._addr
    x = np.ones(4, np.float32)
    big = np.ones(4 * P, np.float32)
    big2 = np.zeros(4 * P, np.float32)
    codes = {c: i for i, c in enumerate(_C.COLLECTIVES)}
    got = [
        _C.fast_collective(addr, codes["all_reduce"], x, None, "sum", "auto", 0, False, None),
        _C.fast_collective(addr, codes["all_reduce"], x, None, "premul_sum", "ring", 0, False, 2.0),
        _C.fast_collective(addr, codes["all_gather"], x, big, "sum", "ring", 0, False, None),
        _C.fast_collective(addr, codes["reduce_scatter"], big, x, "max", "auto", 0, False, None),
        _C.fast_collective(addr, codes["all_to_all"], big, big2, "sum", "auto", 0, False, None),
        _C.fast_collective(addr, codes["broadcast"], x, None, "sum", "auto", P - 1, False, None),
        _C.fast_collective(addr, codes["reduce"], x, None, "min", "auto", 0, False, None),
        _C.fast_collective(addr, codes["gather"], x, big if r == 0 else None, "sum", "auto", 0, False, None),
        _C.fast_collective(addr, codes["scatter"], big if r == 0 else None, x, "sum", "auto", 0, False, None),
        _C.fast_collective(addr, codes["barrier"], None, None, "sum", "auto", 0, False, None),
    ]
    return [g is None for g in got]
