"""Rank-side checks of every collective x algorithm x dtype x op x count against NumPy.

Each rank regenerates every rank's input from a deterministic formula, so the reference needs no
communication. Results come back as failure descriptions plus a digest of every output that must
be bitwise identical across ranks; the pytest side compares the digests.

Float tolerance (stated): the reference is computed in float64 from the same rounded inputs. A sum
of P terms in any order, each partial sum rounded to the dtype, is off by at most
(P-1) * u * sum|x_i| with u the unit roundoff (float32 2^-24, float64 2^-53, and for float16 and
bfloat16, which accumulate pairwise in float32 but round to 16 bits after every op, 2^-11 and 2^-8).
We allow 2 * P * u * sum|x_i| plus one rounding of the result; prod uses the same bound relative
to |prod|. min, max and every integer op are exact.
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np

import commlib
from matrix_selection import selected

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64")
DTYPES = FLOATS + INTS
FLOAT_OPS = ("sum", "prod", "min", "max", "avg", "premul_sum")
INT_OPS = FLOAT_OPS + ("band", "bor", "bxor")
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-11, "bfloat16": 2.0**-8}
PREMUL = 0.75
BIG = 1_000_003  # ~1M elements, prime
# Collectives whose buffers hold P blocks of `count` use ~1M elements in all (a ~1M block per
# peer would need P^2 million elements per rank for the reference: gigabytes at 8 ranks).
SPLIT = ("reduce_scatter", "all_to_all", "all_gather", "gather", "scatter")


def _torch():
    import torch
    return torch


def make(dtype: str, values: np.ndarray):
    """An array of ``dtype`` holding ``values`` (float64 or int64), rounded/wrapped to the dtype.

    bfloat16 has no NumPy dtype: it is a torch tensor.
    """
    if dtype == "bfloat16":
        torch = _torch()
        return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
    if dtype in FLOATS:
        return values.astype(dtype)
    return values.astype(np.int64).astype(dtype)  # wraps like C


def empty(dtype: str, n: int):
    if dtype == "bfloat16":
        torch = _torch()
        return torch.full((n,), float("nan"), dtype=torch.bfloat16)
    if dtype in FLOATS:
        return np.full(n, np.nan, dtype)
    return np.full(n, 77, dtype)


def as_f64(x) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        return x.float().numpy().astype(np.float64)
    return x.astype(np.float64)


def raw(x) -> bytes:
    if not isinstance(x, np.ndarray):
        return x.view(_torch().int16).numpy().tobytes()
    return x.tobytes()


def values(dtype: str, op: str, rank: int, n: int, salt: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Deterministic rank-dependent input (float64 or int64 values before the dtype cast): the
    elements [start, stop) of rank ``rank``'s ``n``-element input (all of it by default).

    Element i depends on i alone, so a reference reads just the part it checks. Cached (every
    algorithm and every op but prod reuse the same inputs); callers must not modify the result.
    """
    return _values(dtype, op == "prod", rank, start, n if stop is None else stop, salt)


@functools.lru_cache(maxsize=18)  # a reference's P <= 8 inputs, twice, and this rank's own
def _values(dtype: str, prod: bool, rank: int, start: int, stop: int, salt: int) -> np.ndarray:
    i = np.arange(start, stop, dtype=np.int64)
    h = (i * 2654435761 + (rank + 1) * 40503 + salt * 7919) % 1000003
    if dtype in INTS:
        if prod:
            return (h % 5) - 2 if dtype != "uint8" else h % 4  # small factors, wrap-around still happens
        if dtype == "int8":
            return h % 256 - 128
        if dtype == "uint8":
            return h % 256
        return h * 1103 - 500000000 if dtype == "int32" else h * 9000000007 - 4500000000000
    f = h.astype(np.float64) / 1000003.0  # [0, 1)
    if prod:
        return 0.5 + 1.5 * f  # products of <= 8 factors stay in range even for float16
    return np.round((f - 0.5) * 8.0, 3)


def rounded(dtype, v):
    return as_f64(make(dtype, v)) if dtype in FLOATS else make(dtype, v)


@functools.lru_cache(maxsize=4)
def reduce_ref_for(dtype, op, n, P, start=0, stop=None):
    """Cached reference over elements [start, stop) of the inputs values(dtype, op, q, n) of
    ranks q < P: only the part of the output a rank checks is computed."""
    stop = n if stop is None else stop
    return reduce_ref(dtype, op, (values(dtype, op, q, n, 0, start, stop) for q in range(P)), P)


def _accumulate(acc, x, ufunc):
    if acc is None:
        return x
    ufunc(acc, x, out=acc)
    return acc


def reduce_ref(dtype, op, inputs, P):
    """Reference over the ``P`` rank inputs (an iterable, consumed one at a time and folded in
    place: no P-fold stack); floats in float64, ints with wrap-around in the dtype."""
    if dtype in FLOATS:
        out = mag = None
        for v in inputs:
            x = rounded(dtype, v)  # a fresh float64 array: safe to fold into
            if op == "premul_sum":
                x = as_f64(make(dtype, x * PREMUL))
            if op in ("sum", "premul_sum", "avg"):
                out = _accumulate(out, x, np.add)
                mag = _accumulate(mag, np.abs(x), np.add)
            else:
                out = _accumulate(out, x, {"prod": np.multiply, "min": np.minimum, "max": np.maximum}[op])
        if op == "avg":
            out = out / P
        if op == "prod":
            mag = np.abs(out)
        return out, (None if op in ("min", "max") else mag)
    ufunc = {"sum": np.add, "avg": np.add, "premul_sum": np.add, "prod": np.multiply, "min": np.minimum,
             "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
    out = None
    for v in inputs:
        x = make(dtype, v)  # a fresh array of the dtype: in-place ops wrap like C
        if op == "premul_sum":
            x = np.round(x.astype(np.float64) * PREMUL).astype(np.int64).astype(dtype)
        out = _accumulate(out, x, ufunc)
    if op == "avg":  # integer avg: the wrapped sum divided, truncating toward zero
        w = out.astype(np.int64)
        out = np.where(w < 0, -((-w) // P), w // P).astype(dtype)
    return out, None


def mismatch(dtype, got, want, mag, P):
    """Index of the first element outside tolerance, or None."""
    if dtype in FLOATS:
        g = as_f64(got)
        if mag is None:
            bad = ~((g == want) | (np.isnan(g) & np.isnan(want)))
        else:
            u = UNIT_ROUNDOFF[dtype]
            tol = 2 * P * u * mag + 2 * u * np.abs(want) + 1e-300
            bad = ~(np.abs(g - want) <= tol)
    else:
        bad = got != want
    idx = np.flatnonzero(bad)
    return None if idx.size == 0 else int(idx[0])


def _report(failures, what, dtype, got, want, mag, P):
    k = mismatch(dtype, got, want, mag, P)
    if k is not None:
        failures.append(f"{what}: element {k}: got {as_f64(got)[k] if dtype in FLOATS else got[k]}, "
                        f"expected {want[k]}")
        return False
    return True


def big(collective, P):
    return BIG // P | 1 if collective in SPLIT else BIG


def counts_for(P, collective):
    return sorted({0, 1, max(P - 1, 0), 13, big(collective, P)})


def ops_for(dtype, count):
    ops = INT_OPS if dtype in INTS else FLOAT_OPS
    if count >= 100_000 and dtype not in ("float32", "int32"):
        return ("sum",)  # the large count runs every op on float32/int32 and sum on the rest
    return ops


class HostBuffers:
    """The buffer factory of the host cases: NumPy arrays (torch tensors for bfloat16). The device
    cases (tests/device/device_cases.py) pass one of commlib.emulated arrays to the same case
    functions. Looked up at call time: the device cases swap make/empty for bfloat16."""

    @staticmethod
    def make(dtype, v):
        return make(dtype, v)

    @staticmethod
    def empty(dtype, n):
        return empty(dtype, n)

    @staticmethod
    def to_host(x, dtype):
        return x

    @staticmethod
    def assign(dst, src):
        dst[:] = src


def run_reducing(comm, buffers, collective, algo, dtype, op, count, root, inplace):
    """One all_reduce / reduce_scatter / reduce on ``buffers``' arrays. Returns (the result on the
    host, or None on a rank that gets none, the reference, its magnitudes for the tolerance)."""
    P, r = comm.size, comm.rank
    scale = PREMUL if op == "premul_sum" else None
    n_in = count * P if collective == "reduce_scatter" else count
    x = buffers.make(dtype, values(dtype, op, r, n_in))
    if collective == "reduce" and r != root:
        want = mag = None  # this rank gets no result to check
    elif collective == "reduce_scatter":
        want, mag = reduce_ref_for(dtype, op, n_in, P, r * count, (r + 1) * count)
    else:
        want, mag = reduce_ref_for(dtype, op, n_in, P)
    if collective == "all_reduce":
        out = x if inplace else buffers.empty(dtype, count)
        comm.all_reduce(x, op=op, algorithm=algo, out=None if inplace else out, scale=scale)
    elif collective == "reduce":
        out = x if inplace else buffers.empty(dtype, count)
        comm.reduce(x, root=root, op=op, algorithm=algo, out=None if inplace else out, scale=scale)
    else:
        out = x[r * count:(r + 1) * count] if inplace else buffers.empty(dtype, count)
        comm.reduce_scatter(out, x, op=op, algorithm=algo, scale=scale)
    if collective == "reduce" and r != root:
        return None, want, mag
    return buffers.to_host(out, dtype), want, mag


def algos_for(collective, dtype):
    """Every algorithm of ``collective``; "auto" on float32 only."""
    algos = ["auto"] + commlib.algorithms(collective)
    return algos if dtype == "float32" else algos[1:]


@functools.lru_cache(maxsize=4)
def reducing_selection(collective, P):
    """{(algorithm, count, dtype): ops}: the full product up to 4 ranks, a pairwise covering
    selection of the ops above (matrix_selection.py says which and why)."""
    cells = [(algo, count, dtype) for dtype in DTYPES for count in counts_for(P, collective)
             for algo in algos_for(collective, dtype)]
    return selected(P, cells, lambda cell: ops_for(cell[2], cell[1]))


def check_reducing(comm, collective):
    """all_reduce / reduce_scatter / reduce over every algorithm, dtype, op, count, root (the
    dtype x op product thinned to a pairwise covering above 4 ranks: reducing_selection)."""
    P, r = comm.size, comm.rank
    failures, digests = [], []
    roots = sorted({0, P - 1}) if collective == "reduce" else [0]
    selection = reducing_selection(collective, P)
    # The algorithm varies fastest so the cached inputs and references are reused.
    for dtype in DTYPES:
        for count in counts_for(P, collective):
            for op in ops_for(dtype, count):
                for root in roots:
                    for algo in algos_for(collective, dtype):
                        if op not in selection[(algo, count, dtype)]:
                            continue
                        for inplace in ((False, True) if count < 100_000 else (False,)):
                            what = (f"{collective} {algo} {dtype} {op} count={count} root={root} "
                                    f"{'in-place' if inplace else 'out-of-place'} P={P} rank={r}")
                            try:
                                out, want, mag = run_reducing(comm, HostBuffers, collective, algo, dtype, op, count,
                                                              root, inplace)
                            except Exception as e:  # noqa: BLE001 - report every case
                                failures.append(f"{what}: raised {type(e).__name__}: {e}")
                                continue
                            if out is None:
                                continue
                            if _report(failures, what, dtype, out, want, mag, P) and collective == "all_reduce":
                                digests.append((what.rsplit(" rank=", 1)[0], hashlib.sha1(raw(out)).hexdigest()))
                            if len(failures) > 20:
                                return failures, digests
    return failures, digests


def moving_n(collective, count, P):
    """Elements of each rank's input."""
    return count * (P if collective in ("all_to_all", "scatter") else 1)


def moving_input(collective, dtype, count, P, q, start=0, stop=None):
    """Elements [start, stop) of rank q's input (cached by values())."""
    return values(dtype, "sum", q, moving_n(collective, count, P), 1, start, stop)


@functools.lru_cache(maxsize=2)
def moving_expected(collective, dtype, count, root, r, P):
    """What rank r must hold, built from just the peers' input elements that land there (None
    where it gets nothing)."""
    if collective == "gather" and r != root:
        return None
    if collective in ("all_gather", "gather"):
        return np.concatenate([rounded(dtype, moving_input(collective, dtype, count, P, q)) for q in range(P)])
    if collective == "all_to_all":
        return np.concatenate([rounded(dtype, moving_input(collective, dtype, count, P, q, r * count, (r + 1) * count))
                               for q in range(P)])
    if collective == "broadcast":
        return rounded(dtype, moving_input(collective, dtype, count, P, root))
    return rounded(dtype, moving_input(collective, dtype, count, P, root, r * count, (r + 1) * count))  # scatter


def run_moving(comm, buffers, collective, algo, dtype, count, root, inplace):
    """One all_gather / all_to_all / broadcast / gather / scatter on ``buffers``' arrays. Returns
    (the result on the host, or None on a rank that gets none, the expected result)."""
    P, r = comm.size, comm.rank
    want = moving_expected(collective, dtype, count, root, r, P)
    x = buffers.make(dtype, moving_input(collective, dtype, count, P, r))
    if collective == "all_gather":
        out = buffers.empty(dtype, count * P)
        inp = out[r * count:(r + 1) * count] if inplace else x
        if inplace:
            buffers.assign(inp, x)
        comm.all_gather(out, inp, algorithm=algo)
    elif collective == "all_to_all":
        out = x if inplace else buffers.empty(dtype, count * P)
        comm.all_to_all(out, x, algorithm=algo)
    elif collective == "broadcast":
        out = x
        comm.broadcast(out, root=root, algorithm=algo)
    elif collective == "gather":
        out = buffers.empty(dtype, count * P) if r == root else None
        inp = out[r * count:(r + 1) * count] if (inplace and r == root) else x
        if inplace and r == root:
            buffers.assign(inp, x)
        comm.gather(out, inp, root=root, algorithm=algo)
    else:  # scatter
        out = buffers.empty(dtype, count)
        src = x if r == root else None
        if inplace and r == root:
            out = x[r * count:(r + 1) * count]
        comm.scatter(out, src, root=root, algorithm=algo)
    return (None if out is None else buffers.to_host(out, dtype)), want


def roots_for(collective, P):
    return sorted({0, P - 1, P // 2}) if collective in ("broadcast", "gather", "scatter") else [0]


ITEM_BYTES = {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "float64": 8,
              "int64": 8}


@functools.lru_cache(maxsize=4)
def moving_selection(collective, P):
    """{(algorithm, count, root, item bytes): dtypes}: every dtype up to 4 ranks, a pairwise
    covering selection of the dtypes of each element size above (matrix_selection.py)."""
    cells = [(algo, count, root, size) for size in (1, 2, 4, 8) for count in counts_for(P, collective)
             for root in roots_for(collective, P) for algo in ["auto"] + commlib.algorithms(collective)]
    return selected(P, cells, lambda cell: [d for d in DTYPES if ITEM_BYTES[d] == cell[3]
                                            and cell[0] in algos_for(collective, d)])


def check_moving(comm, collective):
    """all_gather / all_to_all / broadcast / gather / scatter: exact for every dtype (the dtypes
    thinned to a pairwise covering above 4 ranks: moving_selection)."""
    P, r = comm.size, comm.rank
    failures, digests = [], []
    selection = moving_selection(collective, P)
    for dtype in DTYPES:
        for count in counts_for(P, collective):
            for root in roots_for(collective, P):
                for algo in algos_for(collective, dtype):
                    if dtype not in selection[(algo, count, root, ITEM_BYTES[dtype])]:
                        continue
                    # broadcast has no out-of-place form: one run, not two identical ones
                    for inplace in ((True,) if collective == "broadcast" else (False, True)):
                        if inplace and collective in ("all_to_all", "scatter", "gather") and count >= 100_000:
                            continue
                        what = (f"{collective} {algo} {dtype} count={count} root={root} "
                                f"{'in-place' if inplace else 'out-of-place'} P={P} rank={r}")
                        try:
                            out, want = run_moving(comm, HostBuffers, collective, algo, dtype, count, root, inplace)
                        except Exception as e:  # noqa: BLE001
                            failures.append(f"{what}: raised {type(e).__name__}: {e}")
                            continue
                        if out is None:
                            continue
                        if _report(failures, what, dtype, out, want, None, P) and collective in ("all_gather", "broadcast"):
                            digests.append((what.rsplit(" rank=", 1)[0], hashlib.sha1(raw(out)).hexdigest()))
                        if len(failures) > 20:
                            return failures, digests
    return failures, digests


def check_collective(comm, collective):
    if collective in ("all_reduce", "reduce_scatter", "reduce"):
        return check_reducing(comm, collective)
    if collective == "barrier":
        for algo in commlib.algorithms("barrier"):
            for _ in range(20):
                comm.barrier()
        return [], []
    return check_moving(comm, collective)


def check_p2p(comm):
    """Ring shifts with sendrecv and batches, every dtype, sizes 0..BIG."""
    P, r = comm.size, comm.rank
    failures = []
    if P == 1:
        return failures
    for dtype in DTYPES:
        for count in (0, 1, 13, BIG):
            x = make(dtype, values(dtype, "sum", r, count, 2))
            out = empty(dtype, count)
            comm.sendrecv(x, (r + 1) % P, out, (r - 1) % P)
            want = rounded(dtype, values(dtype, "sum", (r - 1) % P, count, 2))
            _report(failures, f"sendrecv {dtype} count={count} rank={r}", dtype, out, want, None, P)
    # Plain send/recv in a chain 0 -> 1 -> ... (blocking, ordered).
    buf = np.zeros(1000, np.int64)
    if r == 0:
        buf[:] = np.arange(1000)
        comm.send(buf, 1)
    else:
        comm.recv(buf, r - 1)
        buf += 1
        if r + 1 < P:
            comm.send(buf, r + 1)
    if not np.array_equal(buf, np.arange(1000) + r):
        failures.append(f"chain send/recv on rank {r}: got {buf[:3]}")
    return failures


def check_async_order(comm):
    """Many async calls complete in order and give the same results as blocking ones."""
    P, r = comm.size, comm.rank
    xs = [np.full(1000 + k, r + k, np.int64) for k in range(20)]
    works = [comm.all_reduce(x, async_op=True, algorithm="ring" if k % 2 else "auto") for k, x in enumerate(xs)]
    for w in works:
        w.wait()
    assert all(w.is_completed() for w in works)
    bad = [k for k, x in enumerate(xs) if not (x == sum(q + k for q in range(P))).all()]
    return bad


def torch_tensors(comm):
    """torch CPU tensors (incl. bfloat16) in and out of place, and refusal of non-contiguous ones."""
    torch = _torch()
    P, r = comm.size, comm.rank
    x = torch.arange(10, dtype=torch.bfloat16) + r
    comm.all_reduce(x)
    ok = torch.equal(x, sum(torch.arange(10, dtype=torch.float32) + q for q in range(P)).to(torch.bfloat16))
    y = torch.empty(P * 3, dtype=torch.float64)
    comm.all_gather(y, torch.full((3,), float(r), dtype=torch.float64))
    ok &= torch.equal(y, torch.arange(P, dtype=torch.float64).repeat_interleave(3))
    try:
        comm.all_reduce(torch.zeros(4, 4).t())
        ok = False
    except ValueError as e:
        ok &= "tensor" in str(e) and "contiguous" in str(e)
    return bool(ok)


def many_small(comm, n):
    x = np.ones(1, np.float32)
    for _ in range(n):
        comm.all_reduce(x, op="max")
    return float(x[0])


def direct_reads_enabled(comm):
    """Whether this rank announced single-copy reads (COMMLIB_CMA=1 and the OS allows them)."""
    import os
    return os.environ.get("COMMLIB_CMA") == "1" and comm._core.enable_direct_reads()
