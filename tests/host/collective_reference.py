"""Inputs, references and tolerances of the collective matrices (host: collective_cases.py,
device: tests/stream/device_cases.py): pure NumPy, no communicator, no torch.

Each rank regenerates every rank's input from a deterministic formula, so the reference needs no
communication.

Float tolerance (stated): the reference is computed in float64 from the same rounded inputs. A sum
of P terms in any order, each partial sum rounded to the dtype, is off by at most
(P-1) * u * sum|x_i| with u the unit roundoff (float32 2^-24, float64 2^-53, and for float16 and
bfloat16, which accumulate pairwise in float32 but round to 16 bits after every op, 2^-11 and 2^-8).
We allow 2 * P * u * sum|x_i| plus one rounding of the result; prod uses the same bound relative
to |prod|. min, max and every integer op are exact.

bfloat16 has no NumPy dtype: its values are held as uint16 bit patterns (``BF16``); each route's
buffer factory turns them into what its communicator takes.
"""
from __future__ import annotations

import functools

import numpy as np

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
ITEM_BYTES = {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "float64": 8,
              "int64": 8}
BF16_NAN = 0x7FC0


class BF16(np.ndarray):
    """uint16 bit patterns of bfloat16 values."""


def bf16_bits(values) -> BF16:
    """bfloat16 bit patterns of ``values``, rounded to nearest even (finite values: no carry out
    of 32 bits). In place on 32-bit words, as fast as torch's conversion."""
    u = np.array(values, np.float32).view(np.uint32)
    r = u >> 16
    r &= 1
    r += 0x7FFF
    r += u
    r >>= 16
    return r.astype(np.uint16).view(BF16)


def bf16_values(bits) -> np.ndarray:
    """The float64 values of bfloat16 bit patterns."""
    u = np.asarray(bits).view(np.uint16).astype(np.uint32)
    u <<= 16
    return u.view(np.float32).astype(np.float64)


def make(dtype: str, values: np.ndarray) -> np.ndarray:
    """An array of ``dtype`` holding ``values`` (float64 or int64), rounded/wrapped to the dtype
    (bfloat16: ``BF16`` bit patterns)."""
    if dtype == "bfloat16":
        return bf16_bits(values)
    if dtype in FLOATS:
        return values.astype(dtype)
    return values.astype(np.int64).astype(dtype)  # wraps like C


def empty(dtype: str, n: int) -> np.ndarray:
    """``n`` elements of poison (NaN, 77 for integers), so unwritten elements show up as wrong."""
    if dtype == "bfloat16":
        return np.full(n, BF16_NAN, np.uint16).view(BF16)
    if dtype in FLOATS:
        return np.full(n, np.nan, dtype)
    return np.full(n, 77, dtype)


def as_f64(x) -> np.ndarray:
    return bf16_values(x) if isinstance(x, BF16) else x.astype(np.float64)


def raw(x) -> bytes:
    return np.asarray(x).tobytes()


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


def report(failures, what, dtype, got, want, mag, P):
    """Records (``failures.append``) the first element of ``got`` outside tolerance; whether none was."""
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
