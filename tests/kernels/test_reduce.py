"""CPU reduction kernels (csrc/kernels) against NumPy references, bit for bit.

Every dtype x op, awkward lengths, unaligned views, dst aliasing src, NaN handling, the bitwise
commutativity of min/max (+-0 included) that keeps ranks bitwise identical, argument checks, and
every vector path this CPU supports (baseline / avx2 / avx512).

Reference numerics: a single IEEE op is correctly rounded, so float32/float64 results must equal
NumPy's exactly; float16/bfloat16 widen to float32, apply the op, round back once to nearest even.
The kernels canonicalise NaN results (0x7fc00000, 0x7ff8000000000000, 0x7e00, 0x7fc0), so the
reference does too and NaNs are compared bit for bit as well.
"""
import numpy as np
import pytest

import commlib._C as _C
from kernel_reference import (BITS, BITWISE_OPS, CANONICAL_NAN, CASES, DTYPES, FLOATS, INTS, LENGTHS,
                              PATH_LENGTHS, STORAGE, assert_bits_equal, f32_to_bf16, is_nan, ops_for,
                              random_data, reference_divide, reference_reduce, reference_scale, seed,
                              special_values, unaligned_copy)
from commlib.core import call_spec
from commlib.core.call_spec import DTYPE, OP


@pytest.fixture(params=_C._cpu_paths())
def cpu_path(request):
    prev = _C._set_cpu_path(request.param)
    yield request.param
    _C._set_cpu_path(prev)


# ------------------------------------------------------------------------------------------------
# reduce_local


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_matches_reference(dtype, op, n):
    rng = np.random.default_rng(seed(dtype, op, n))
    a = random_data(dtype, n, rng)
    b = random_data(dtype, n, rng)
    want = reference_reduce(a, b, dtype, op)
    b_before = b.copy()
    dst = a.copy()
    _C.reduce_local(dst, b, DTYPE[dtype], OP[op])
    assert_bits_equal(dst, want, f"{dtype} {op} n={n}")
    assert_bits_equal(b, b_before, "src must be untouched")


@pytest.mark.parametrize("n", PATH_LENGTHS)
@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_every_vector_path(cpu_path, dtype, op, n):
    rng = np.random.default_rng(seed(dtype, op, n, cpu_path))
    a = random_data(dtype, n, rng)
    b = random_data(dtype, n, rng)
    want = reference_reduce(a, b, dtype, op)
    dst = a.copy()
    _C.reduce_local(dst, b, DTYPE[dtype], OP[op])
    assert_bits_equal(dst, want, f"{cpu_path}: {dtype} {op} n={n}")


@pytest.mark.parametrize("n", [1, 7, 33, 1000])
@pytest.mark.parametrize("dst_off,src_off", [(1, 0), (0, 1), (1, 1), (1, 3), ("elem", 0), ("elem", "elem")])
@pytest.mark.parametrize("dtype,op", [(d, o) for d in DTYPES for o in ("sum", "max", "prod")])
def test_reduce_unaligned(dtype, op, n, dst_off, src_off):
    rng = np.random.default_rng(n)
    a = random_data(dtype, n, rng)
    b = random_data(dtype, n, rng)
    size = np.dtype(STORAGE[dtype]).itemsize
    dst = unaligned_copy(a, size if dst_off == "elem" else dst_off)
    src = unaligned_copy(b, size if src_off == "elem" else src_off)
    _C.reduce_local(dst, src, DTYPE[dtype], OP[op])
    assert_bits_equal(dst, reference_reduce(a, b, dtype, op), f"{dtype} {op} offsets {dst_off},{src_off}")
    assert_bits_equal(src, b, "src must be untouched")


def test_reduce_unaligned_every_path(cpu_path):
    rng = np.random.default_rng(7)
    for dtype in DTYPES:
        for op in ops_for(dtype):
            a, b = random_data(dtype, 1001, rng), random_data(dtype, 1001, rng)
            dst, src = unaligned_copy(a, 1), unaligned_copy(b, 3)
            _C.reduce_local(dst, src, DTYPE[dtype], OP[op])
            assert_bits_equal(dst, reference_reduce(a, b, dtype, op), f"{cpu_path}: {dtype} {op}")


@pytest.mark.parametrize("n", [1, 31, 10007])
@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_dst_aliases_src(dtype, op, n):
    a = random_data(dtype, n, np.random.default_rng(n))
    want = reference_reduce(a, a, dtype, op)
    dst = a.copy()
    _C.reduce_local(dst, dst, DTYPE[dtype], OP[op])
    assert_bits_equal(dst, want, f"{dtype} {op} in place")


@pytest.mark.parametrize("dtype", INTS)
def test_integer_wraparound(dtype):
    info = np.iinfo(STORAGE[dtype])
    a = np.array([info.max, info.min, info.max, -1 if info.min else info.max, 2], dtype=STORAGE[dtype])
    b = np.array([1, -1 if info.min else info.max, info.max, info.min, info.max], dtype=STORAGE[dtype])
    for op in ("sum", "prod"):
        dst = a.copy()
        _C.reduce_local(dst, b, DTYPE[dtype], OP[op])
        want = [(int(x) + int(y)) if op == "sum" else int(x) * int(y) for x, y in zip(a.tolist(), b.tolist())]
        want = np.array([w % (1 << info.bits) for w in want], dtype=np.uint64).astype(BITS[a.itemsize])
        assert_bits_equal(dst, want.view(STORAGE[dtype]), f"{dtype} {op} wrap-around")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_nan_propagates(dtype, op):
    vals = special_values(dtype)
    a = np.repeat(vals, len(vals))
    b = np.tile(vals, len(vals))
    dst = a.copy()
    _C.reduce_local(dst, b, DTYPE[dtype], OP[op])
    either = is_nan(a, dtype) | is_nan(b, dtype)
    assert is_nan(dst, dtype)[either].all(), f"{op}: NaN lost"
    # and every NaN result is the canonical quiet NaN
    got_nan = is_nan(dst, dtype)
    assert (dst.view(BITS[dst.itemsize])[got_nan] == CANONICAL_NAN[dtype]).all()
    assert_bits_equal(dst, reference_reduce(a, b, dtype, op), f"{dtype} {op} specials")


@pytest.mark.parametrize("dtype", FLOATS)
def test_min_max_signed_zero(dtype):
    z = special_values(dtype)[[4, 5]]  # +0, -0
    sign = BITS[z.itemsize](1) << BITS[z.itemsize](8 * z.itemsize - 1)
    for op, want_negative in (("min", True), ("max", False)):
        for a, b in ((z[0:1], z[1:2]), (z[1:2], z[0:1])):
            dst = a.copy()
            _C.reduce_local(dst, b, DTYPE[dtype], OP[op])
            bits = dst.view(BITS[dst.itemsize])[0]
            assert bool(bits & sign) == want_negative and (bits & ~sign) == 0, (dtype, op, a, b, hex(int(bits)))


@pytest.mark.parametrize("dtype,op", CASES)
def test_bitwise_commutative(dtype, op):
    """op(a, b) and op(b, a) are identical bit for bit: ranks combine in different orders."""
    rng = np.random.default_rng(11)
    a = random_data(dtype, 5000, rng)
    b = random_data(dtype, 5000, rng)
    if dtype in FLOATS:  # all pairs of specials as well
        s = special_values(dtype)
        a = np.concatenate([a, np.repeat(s, len(s))])
        b = np.concatenate([b, np.tile(s, len(s))])
    ab, ba = a.copy(), b.copy()
    _C.reduce_local(ab, b, DTYPE[dtype], OP[op])
    _C.reduce_local(ba, a, DTYPE[dtype], OP[op])
    assert_bits_equal(ab, ba, f"{dtype} {op} commutativity")


def test_half_conversions_exhaustive(cpu_path):
    """All 65536 float16 and bfloat16 patterns: x + (-0) keeps x exactly (NaN -> canonical)."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for dtype, neg_zero in (("float16", 0x8000), ("bfloat16", 0x8000)):
        src = np.full_like(bits, neg_zero)
        dst = bits.copy()
        _C.reduce_local(dst, src, DTYPE[dtype], _C.RedOp.sum)
        want = bits.copy()
        want[is_nan(bits, dtype)] = CANONICAL_NAN[dtype]
        assert_bits_equal(dst, want, f"{dtype} identity")
        # the reference path through float32 agrees as well
        assert_bits_equal(dst, reference_reduce(bits, src, dtype, "sum"), f"{dtype} reference")


def test_half_rounding_exhaustive_pairs(cpu_path):
    """Products of every float16 value with a few factors hit every rounding case (ties,
    subnormals, overflow to Inf) of float32 -> float16 and float32 -> bfloat16."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for dtype in ("float16", "bfloat16"):
        for factor in (0.5, 1.5, 3.0, 0.1, 1.0009765625, 2.0 ** -10, 7.0e3):
            fb = (np.array([factor], np.float32).astype(np.float16).view(np.uint16) if dtype == "float16"
                  else f32_to_bf16(np.array([factor], np.float32)))
            src = np.full_like(bits, fb[0])
            for op in ("prod", "sum"):
                dst = bits.copy()
                _C.reduce_local(dst, src, DTYPE[dtype], OP[op])
                assert_bits_equal(dst, reference_reduce(bits, src, dtype, op),
                                  f"{cpu_path}: {dtype} {op} x {factor}")


def test_float32_sum_rounds_to_nearest_even():
    a = np.array([1.0, 1.0, 3.0, 1e8, 16777216.0], np.float32)
    b = np.array([2.0 ** -24, 3 * 2.0 ** -24, 2.0 ** -23, 4.0, 1.0], np.float32)
    dst = a.copy()
    _C.reduce_local(dst, b, _C.DType.float32, _C.RedOp.sum)
    np.testing.assert_array_equal(dst, a + b)
    assert dst[0] == 1.0 and dst[4] == 16777216.0  # ties to even


# ------------------------------------------------------------------------------------------------
# scale_copy and divide_local


@pytest.mark.parametrize("n", [0, 1, 7, 33, 100003])
@pytest.mark.parametrize("scale", [0.5, -1.25, 3.0, 1e-3, 1e30])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_copy(dtype, scale, n):
    a = random_data(dtype, n, np.random.default_rng(n))
    dst = np.zeros_like(a)
    _C.scale_copy(dst, a, DTYPE[dtype], scale)
    assert_bits_equal(dst, reference_scale(a, dtype, scale), f"{dtype} x {scale}")


def test_scale_copy_every_path_unaligned_and_in_place(cpu_path):
    rng = np.random.default_rng(5)
    for dtype in DTYPES:
        a = random_data(dtype, 1003, rng)
        want = reference_scale(a, dtype, 0.37)
        dst = unaligned_copy(np.zeros_like(a), 1)
        _C.scale_copy(dst, unaligned_copy(a, 3), DTYPE[dtype], 0.37)
        assert_bits_equal(dst, want, f"{cpu_path}: {dtype} scale_copy unaligned")
        inplace = a.copy()
        _C.scale_copy(inplace, inplace, DTYPE[dtype], 0.37)
        assert_bits_equal(inplace, want, f"{cpu_path}: {dtype} scale_copy in place")


def test_scale_copy_integers_round_half_even_and_saturate():
    a = np.array([1, 3, 5, -1, -3, 100, -100], np.int8)
    dst = np.zeros_like(a)
    _C.scale_copy(dst, a, _C.DType.int8, 0.5)
    np.testing.assert_array_equal(dst, [0, 2, 2, 0, -2, 50, -50])
    _C.scale_copy(dst, a, _C.DType.int8, 2.0)
    np.testing.assert_array_equal(dst, [2, 6, 10, -2, -6, 127, -128])


@pytest.mark.parametrize("n", [0, 1, 7, 33, 100003])
@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 8, 1000, 2**40])
@pytest.mark.parametrize("dtype", DTYPES)
def test_divide_local(dtype, divisor, n):
    a = random_data(dtype, n, np.random.default_rng(n + divisor % 97))
    dst = a.copy()
    _C.divide_local(dst, DTYPE[dtype], divisor)
    assert_bits_equal(dst, reference_divide(a, dtype, divisor), f"{dtype} / {divisor}")


def test_divide_every_path_unaligned(cpu_path):
    rng = np.random.default_rng(9)
    for dtype in DTYPES:
        a = random_data(dtype, 1003, rng)
        dst = unaligned_copy(a, 1)
        _C.divide_local(dst, DTYPE[dtype], 3)
        assert_bits_equal(dst, reference_divide(a, dtype, 3), f"{cpu_path}: {dtype} divide")


def test_divide_integers_truncate_toward_zero():
    a = np.array([7, -7, 6, -6, -1, 1, np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64)
    _C.divide_local(a, _C.DType.int64, 2)
    np.testing.assert_array_equal(a, [3, -3, 3, -3, 0, 0, -(2**62), 2**62 - 1])


# ------------------------------------------------------------------------------------------------
# Argument checks


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", BITWISE_OPS)
def test_bitwise_on_floats_raises(dtype, op):
    a = np.zeros(4, STORAGE[dtype])
    with pytest.raises(ValueError, match="op") as exc:
        _C.reduce_local(a, a.copy(), DTYPE[dtype], OP[op])
    assert op in str(exc.value) and dtype in str(exc.value)


def test_bad_arguments_name_the_argument():
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="src"):
        _C.reduce_local(a, np.zeros(7, np.float32), _C.DType.float32, _C.RedOp.sum)
    with pytest.raises(ValueError, match="dst"):
        _C.reduce_local(np.zeros(8, np.float64), a, _C.DType.float32, _C.RedOp.sum)
    with pytest.raises(ValueError, match="src"):
        _C.reduce_local(a, np.zeros(8, np.int16), _C.DType.float32, _C.RedOp.sum)
    with pytest.raises(ValueError, match="dtype"):
        _C.reduce_local(a, a.copy(), call_spec.dtype("complex64"), _C.RedOp.sum)
    with pytest.raises(ValueError, match="op"):
        _C.reduce_local(a, a.copy(), _C.DType.float32, call_spec.op("mean"))
    with pytest.raises(ValueError, match="dst"):
        _C.reduce_local(np.zeros(16, np.float32)[::2], a, _C.DType.float32, _C.RedOp.sum)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dst"):
        _C.reduce_local(ro, a, _C.DType.float32, _C.RedOp.sum)
    with pytest.raises(ValueError, match="src"):
        _C.scale_copy(a, np.zeros(9, np.float32), _C.DType.float32, 2.0)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="divisor"):
            _C.divide_local(a, _C.DType.float32, bad)


def test_accepts_float16_arrays_and_uint16_bits():
    x = np.array([1.5, -2.25, 65504.0], np.float16)
    dst = x.copy()
    _C.reduce_local(dst, x, _C.DType.float16, _C.RedOp.sum)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(dst, (x.astype(np.float32) * 2).astype(np.float16))
    bits = x.view(np.uint16).copy()
    _C.reduce_local(bits, x.view(np.uint16), _C.DType.float16, _C.RedOp.sum)
    assert_bits_equal(bits, dst.view(np.uint16), "uint16 bits")


def test_cpu_features():
    paths = _C._cpu_paths()
    assert paths[-1] == "baseline"
    assert _C.cpu_features() in paths
    with pytest.raises(ValueError, match="path"):
        _C._set_cpu_path("sse9")
