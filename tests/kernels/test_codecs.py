"""The block-wise codecs (commlib.codecs over csrc/kernels/codecs.h): round-trip error within the
stated bound for every codec x dtype x block size x awkward count, idempotence (what lets ranks
forward re-encoded partial sums without drifting apart), reproducible stochastic rounding,
NaN/Inf, the largest finite values, sizes and refused arguments."""
import numpy as np
import pytest

import commlib
from codec_reference import DTYPES, as_dtype, error_bound, sample, to_float
from commlib.codecs import NAMES, Codec

COUNTS = (0, 1, 5, 97, 1000)  # empty, one, under a block, prime, many blocks
BLOCKS = (1, 7, 32, 256)
ROUNDINGS = ("nearest", "stochastic")


@pytest.mark.parametrize("codec", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_within_the_stated_bound_and_idempotent(codec, dtype):
    for block in BLOCKS if codec != "bf16" else (32,):
        for rounding in ROUNDINGS:
            c = Codec(codec, block, rounding, seed=7)
            for count in COUNTS:
                x = as_dtype(sample(count, seed=count + block), dtype)
                data = c.encode(x, dtype)
                assert data.dtype == np.uint8 and data.size == c.encoded_size(count)
                y = c.decode(data, count, dtype)
                assert y.dtype == x.dtype and y.size == count
                xf, yf = to_float(x), to_float(y)
                err = np.abs(yf.astype(np.float64) - xf)
                bound = error_bound(codec, xf, block, rounding == "stochastic")
                bad = np.nonzero(err > bound)[0]
                assert bad.size == 0, (f"{codec} {dtype} block {block} {rounding} n={count}: x={xf[bad[:3]]} "
                                       f"decoded {yf[bad[:3]]}, bound {bound[bad[:3]]}")
                # decode(encode(.)) is a projection: re-encoding decoded values changes nothing
                again = c.encode(y, dtype)
                assert np.array_equal(c.decode(again, count, dtype), y)
                if rounding == "nearest":  # and bit for bit under nearest rounding
                    assert np.array_equal(again, data)


@pytest.mark.parametrize("codec", NAMES)
def test_stochastic_rounding_is_seeded_and_unbiased(codec):
    x = np.full(4096, 0.3, dtype=np.float32)
    x[::64] = 1.0  # fixes each block's scale, so 0.3 lies between grid points
    a = Codec(codec, 64, "stochastic", seed=1)
    assert np.array_equal(a.encode(x), a.encode(x))  # reproducible from the seed
    assert not np.array_equal(a.encode(x), Codec(codec, 64, "stochastic", seed=2).encode(x))
    assert not np.array_equal(a.encode(x), a.encode(x, counter_base=4096))  # the counter moves on
    y = a.round_trip(x)
    near = Codec(codec, 64).round_trip(x)
    mask = x != 1.0
    assert len(np.unique(y[mask])) == 2  # rounds both ways...
    # ...and averages out where nearest rounding is biased by a whole fraction of a step
    assert abs(y[mask].mean() - 0.3) < abs(near[mask][0] - 0.3) / 4


@pytest.mark.parametrize("codec", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf(codec, dtype):
    xf = np.array([1.5, np.nan, -2.0, np.inf, 0.25, -np.inf, 3.0, -0.5], dtype=np.float32)
    x = as_dtype(xf, dtype)
    raw = Codec(codec, 4).round_trip(x, dtype)
    y = to_float(raw)
    nonfinite = ~np.isfinite(xf)
    # every NaN decodes canonical (quiet, no payload, positive), as the reduction kernels' are
    canonical = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}[dtype]
    bits = raw.view({"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}[dtype])
    assert all(int(b) == canonical for b in bits[np.isnan(y)]), [hex(int(b)) for b in bits[np.isnan(y)]]
    # zeros decode as +0 (a -0 input included), but bf16 keeps the sign as a bfloat16 cast does
    z = to_float(Codec(codec, 4).round_trip(as_dtype(np.array([-0.0, 0.0, 1.0, -1.0], np.float32), dtype), dtype))
    assert list(np.signbit(z[:2])) == [codec == "bf16", False]
    keeps_inf = codec in ("bf16", "fp8_e5m2")
    assert np.isnan(y[1])
    if keeps_inf:
        assert y[3] == np.inf and y[5] == -np.inf
    else:
        assert np.isnan(y[3]) and np.isnan(y[5])
    # the finite elements of a block with Inf/NaN keep their bound (the scale ignores non-finite values)
    finite = ~nonfinite
    bound = error_bound(codec, np.where(finite, xf, 0).astype(np.float32), 4, False)
    assert np.all(np.abs(y[finite] - xf[finite]) <= bound[finite])


@pytest.mark.parametrize("codec", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_largest_finite_values_stay_finite(codec, dtype):
    big = {"float32": np.finfo(np.float32).max, "float16": 65504.0, "bfloat16": 3.3895313892515355e38}[dtype]
    xf = np.array([big, -big, big * 0.999, 1.0], dtype=np.float32)
    for rounding in ROUNDINGS:
        y = to_float(Codec(codec, 4, rounding).round_trip(as_dtype(xf, dtype), dtype))
        assert np.all(np.isfinite(y)), (rounding, y)


def test_encoded_sizes():
    assert Codec("int8", 32).encoded_size(100) == 4 + 100
    assert Codec("int4", 32).encoded_size(101) == 4 + 51
    assert Codec("fp8_e4m3", 7).encoded_size(14) == 2 + 14
    assert Codec("bf16").encoded_size(10) == 20
    assert all(Codec(n).encoded_size(0) == 0 for n in NAMES)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="compress"):
        Codec("int3")
    with pytest.raises(ValueError, match="block_size"):
        Codec("int8", 0)
    with pytest.raises(ValueError, match="rounding"):
        Codec("int8", 32, "up")
    with pytest.raises(ValueError, match="dtype"):
        Codec("int8").encode(np.arange(4, dtype=np.int32))
    with pytest.raises(ValueError, match="dtype"):
        Codec("int8").encode(np.zeros(4, dtype=np.float64))
    with pytest.raises(ValueError, match="data"):
        Codec("int8").decode(np.zeros(3, dtype=np.uint8), 4)
    with pytest.raises(ValueError, match="seed"):
        Codec("int8", 32, "stochastic", seed=-1)
    with pytest.raises(ValueError, match="block_size"):
        Codec("int8", True)
    with pytest.raises(TypeError, match="inter_only"):
        Codec("int8", inter_only=1)
    with pytest.raises(ValueError, match="count"):
        Codec("int8").decode(np.zeros(0, dtype=np.uint8), -1)
    with pytest.raises(TypeError, match="compress"):
        commlib.codecs.get(3)
    assert commlib.codecs.get("int4") == Codec("int4")
