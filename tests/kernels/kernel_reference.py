"""Shared by the kernel tests: dtype tables, test data and bit-exact NumPy references.

Reference numerics: a single IEEE op is correctly rounded, so float32/float64 results must equal
NumPy's exactly; float16/bfloat16 widen to float32, apply the op, round back once to nearest even
(bfloat16 rounding done here with integer ops). The kernels canonicalise NaN results (0x7fc00000,
0x7ff8000000000000, 0x7e00, 0x7fc0), so the reference does too and NaNs compare bit for bit.
"""
import zlib

import numpy as np
import pytest

FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int8", "uint8", "int32", "int64"]
DTYPES = FLOATS + INTS
ARITH_OPS = ["sum", "prod", "min", "max", "avg", "premul_sum"]
BITWISE_OPS = ["band", "bor", "bxor"]
LENGTHS = [0, 1, 3, 7, 15, 31, 33, 1000003]
PATH_LENGTHS = [0, 1, 33, 4099]  # for the non-default vector paths: tails and a full body

STORAGE = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16,
           "int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64}
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
CANONICAL_NAN = {"float32": 0x7FC00000, "float64": 0x7FF8000000000000, "float16": 0x7E00, "bfloat16": 0x7FC0}


def ops_for(dtype):
    return ARITH_OPS + (BITWISE_OPS if dtype in INTS else [])


CASES = [(d, o) for d in DTYPES for o in ops_for(d)]


def seed(*parts):
    return zlib.crc32(repr(parts).encode())


# ------------------------------------------------------------------------------------------------
# Data


def random_data(dtype, n, rng):
    """Values that exercise rounding, overflow, wrap-around and the special values."""
    st = STORAGE[dtype]
    if dtype in INTS:
        info = np.iinfo(st)
        return rng.integers(info.min, info.max, size=n, dtype=st, endpoint=True)
    if dtype in ("float16", "bfloat16"):
        # Every bit pattern: NaNs, infinities, subnormals, both zeros.
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        nice = rng.random(n) < 0.5  # and half ordinary values so sums round non-trivially
        vals = (rng.standard_normal(n) * 4).astype(np.float32)
        nice_bits = vals.astype(np.float16).view(np.uint16) if dtype == "float16" else f32_to_bf16(vals)
        bits[nice] = nice_bits[nice]
        return bits.view(st)
    ut = BITS[np.dtype(st).itemsize]
    bits = rng.integers(0, np.iinfo(ut).max, size=n, dtype=ut, endpoint=True)
    vals = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, size=n)).astype(st)
    out = bits.view(st).copy()
    nice = rng.random(n) < 0.7
    out[nice] = vals[nice]
    if n:
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(st).tiny / 4, -np.finfo(st).max],
                            dtype=st)
        idx = rng.integers(0, n, size=min(n, 16))
        out[idx] = specials[rng.integers(0, len(specials), size=len(idx))]
    return out


# ------------------------------------------------------------------------------------------------
# References


def f32_to_bf16(x):
    """float32 -> bfloat16 bits, round to nearest even (integer ops), NaN quieted."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    upper = u >> 16
    low = u & 0xFFFF
    up = (low > 0x8000) | ((low == 0x8000) & ((upper & 1) == 1))
    out = upper + up.astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = np.where(nan, upper | 0x40, out)
    return out.astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def canon(x, name):
    x = x.copy()
    x.view(BITS[x.itemsize])[np.isnan(x)] = CANONICAL_NAN[name]
    return x


def float_minmax(a, b, is_min):
    """min/max with NaN propagation; on +-0 ties min gives -0 and max +0 in either order."""
    ut = BITS[a.itemsize]
    ua, ub = a.view(ut), b.view(ut)
    with np.errstate(invalid="ignore"):
        tie = (ua | ub) if is_min else (ua & ub)
        first = (a < b) if is_min else (a > b)
        second = (b < a) if is_min else (b > a)
    bits = np.where(first, ua, np.where(second, ub, tie))
    out = bits.view(a.dtype).copy()
    out[np.isnan(a) | np.isnan(b)] = np.nan
    return out


def apply_op(a, b, op):
    """One op in a's own NumPy dtype (float32 for the 16-bit floats)."""
    if op in ("sum", "avg", "premul_sum"):
        return a + b
    if op == "prod":
        return a * b
    if op in ("min", "max"):
        if a.dtype.kind == "f":
            return float_minmax(a, b, op == "min")
        return np.minimum(a, b) if op == "min" else np.maximum(a, b)
    return {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op](a, b)


def to_compute(x, dtype):
    if dtype == "float16":
        return x.view(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_to_f32(x)
    return x


def from_compute(x, dtype):
    if dtype in FLOATS:
        name = "float64" if dtype == "float64" else "float32"
        x = canon(x, name)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if dtype == "bfloat16":
        return f32_to_bf16(x)
    return x


def reference_reduce(a, b, dtype, op):
    with np.errstate(all="ignore"):
        r = apply_op(to_compute(a, dtype), to_compute(b, dtype), op)
    return from_compute(r, dtype)


def reference_scale(a, dtype, scale):
    if dtype in INTS:
        info = np.iinfo(STORAGE[dtype])
        r = np.rint(a.astype(np.float64) * scale)
        hi = r >= 2.0 ** (info.bits - 1 if info.min < 0 else info.bits)
        lo = r <= float(info.min)
        out = np.where(hi | lo, 0, r).astype(STORAGE[dtype])
        out[hi] = info.max
        out[lo] = info.min
        return out
    ct = np.float64 if dtype == "float64" else np.float32
    with np.errstate(all="ignore"):
        r = to_compute(a, dtype) * ct(scale)
    return from_compute(r, dtype)


def reference_divide(a, dtype, divisor):
    if dtype in INTS:
        info = np.iinfo(STORAGE[dtype])
        if divisor > info.max:
            return np.zeros_like(a)
        d = STORAGE[dtype](divisor)
        q = a // d
        fix = (a % d != 0) & (a < 0)  # floor -> truncation toward zero
        return (q + fix.astype(a.dtype)).astype(a.dtype)
    ct = np.float64 if dtype == "float64" else np.float32
    with np.errstate(all="ignore"):
        r = to_compute(a, dtype) / ct(divisor)
    return from_compute(r, dtype)


def assert_bits_equal(got, want, what=""):
    got = np.ascontiguousarray(got)
    want = np.ascontiguousarray(want)
    assert got.shape == want.shape
    ut = BITS[got.itemsize]
    gb, wb = got.view(ut), want.view(ut)
    bad = np.flatnonzero(gb != wb)
    if len(bad):
        i = bad[:5]
        pytest.fail(f"{what}: {len(bad)} of {len(gb)} elements differ; first at {i.tolist()}: "
                    f"got {[hex(int(v)) for v in gb[i]]}, want {[hex(int(v)) for v in wb[i]]}")


def unaligned_copy(x, byte_offset):
    """A copy of x living at the given byte offset from a 64-byte aligned address."""
    nbytes = x.nbytes
    raw = np.zeros(nbytes + 128, dtype=np.uint8)
    base = (-raw.ctypes.data) % 64
    view = raw[base + byte_offset: base + byte_offset + nbytes].view(x.dtype)
    view[...] = x
    assert view.ctypes.data % 64 == byte_offset % 64
    return view


def special_values(dtype):
    vals = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-30, -2.5e-8, 3.0e4],
                    dtype=np.float32)
    if dtype == "float16":
        return vals.astype(np.float16)
    if dtype == "bfloat16":
        return f32_to_bf16(vals)
    return vals.astype(STORAGE[dtype])


def is_nan(x, dtype):
    return np.isnan(to_compute(x, dtype))
