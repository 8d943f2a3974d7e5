"""The codecs' vectorised CPU loops (csrc/kernels/cpu_codecs.cc, cpu_codec_loops.h) against their
scalar reference, the functors of codecs.h one element at a time (``reference=True``, what a GPU
launcher runs): the same bytes from encode and the same bits from decode, for every codec x dtype
x block size x rounding, on awkward counts and on data that reaches every branch (ties, the fp8
grids' subnormals, values near the dtype's largest, NaN/Inf blocks, zeros of both signs)."""
import numpy as np
import pytest

from codec_reference import as_dtype, awkward, codec_cases, sample
from commlib import _C
from commlib.codecs import NAMES, Codec

COUNTS = (0, 1, 5, 97, 1000, 4099)  # empty, one, under a block, primes, many blocks
BLOCKS = (1, 7, 32, 256)


@pytest.fixture(params=_C._cpu_paths())
def cpu_path(request):
    """Each vector path this CPU runs, then the baseline: the int8/int4 nearest loops of error
    feedback, the projection and the integer encode and decode have an AVX2 entry beside the SSE2 one
    (cpu_error_feedback.cc, cpu_codecs.cc)."""
    prev = _C._set_cpu_path(request.param)
    yield request.param
    _C._set_cpu_path(prev)


def threshold_blocks(top: float, block: int) -> np.ndarray:
    """Blocks whose largest magnitude sits where the scale exponent changes (int_scale_exp's closed
    form, cpu_codec_loops.h): (top + 1/2) 2^k (nearest rounds it over top) and top 2^k (stochastic
    judges amax itself), each one float32 ulp below, at and above, over binades from float32's
    subnormals to its largest; the rest of each block small values of both signs."""
    amaxes = []
    for k in list(range(-149, -120, 3)) + list(range(-40, 41, 7)) + [120, 121]:
        for base in (top + 0.5, top):
            a = np.float32(base * 2.0 ** k)
            if not np.isfinite(a) or a == 0:
                continue
            amaxes += [np.nextafter(a, np.float32(0)), a, np.nextafter(a, np.float32(np.inf))]
    rng = np.random.default_rng(block)
    out = []
    for i, a in enumerate(amaxes):
        b = (rng.uniform(-0.9, 0.9, block) * a).astype(np.float32)
        b[i % block] = a if i % 2 else -a
        out.append(b)
    return np.concatenate(out)


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_scale_threshold_blocks_match_the_functors(codec, cpu_path):
    """The integer grids' scale exponent in closed form (no division loop) picks the functors'
    exponent at its thresholds: encode, the projection, encode with projection and error feedback
    give the reference's bytes and bits on blocks whose amax is one ulp around each threshold."""
    from commlib.core import call_spec
    from commlib.core.codecs import error_feedback_round
    top = 127.0 if codec == "int8" else 7.0
    for block in (7, 32):
        x = threshold_blocks(top, block)
        for rounding in ("nearest", "stochastic"):
            c = Codec(codec, block, rounding, seed=3)
            what = f"{codec} block {block} {rounding} ({cpu_path})"
            ref = c.encode(x, "float32", 0, reference=True)
            assert np.array_equal(c.encode(x, "float32", 0), ref), f"{what}: encode differs"
            want = c.decode(ref, x.size, "float32", reference=True)
            got = x.copy()
            _C.codec_project(codec, block, rounding, 3, call_spec.dtype("float32"), got, 0)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{what}: projection differs"
            got = x.copy()
            got_bytes = _C.codec_encode_project(codec, block, rounding, 3, call_spec.dtype("float32"), got, 0)
            assert np.array_equal(got_bytes, ref), f"{what}: encode_project's bytes differ"
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{what}: encode_project's values differ"
            g = x.copy()
            r = error_feedback_round(c, g, np.zeros_like(g))
            assert np.array_equal(g.view(np.uint32), want.view(np.uint32)), f"{what}: error feedback differs"
            assert np.array_equal(r, x - want), f"{what}: error feedback's residual differs"


@pytest.mark.parametrize("codec", NAMES)
def test_vectorised_loops_match_the_scalar_functors(codec, cpu_path):
    with np.errstate(over="ignore", invalid="ignore"):
        for dtype, c, count, what in codec_cases(codec, COUNTS, 11, BLOCKS):
            x = as_dtype(awkward(count, count + c.block_size), dtype)
            fast, ref = c.encode(x, dtype, counter_base=5), c.encode(x, dtype, 5, reference=True)
            assert np.array_equal(fast, ref), f"{what}: encode differs at bytes {np.nonzero(fast != ref)[0][:5]}"
            # decode: the encoder's bytes and arbitrary ones (every code, odd scales)
            junk = np.random.default_rng(count).integers(0, 256, fast.size, dtype=np.uint8)
            for data in (fast, junk):
                a, b = c.decode(data, count, dtype), c.decode(data, count, dtype, reference=True)
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{what}: decode differs"


def feedback_reference(codec: Codec, grad: np.ndarray, residual: np.ndarray):
    """Error feedback's step composed of whole-buffer passes (what error_feedback_round ran before
    the fused loop): s = grad + residual, Q(s) by encode and decode, s - Q(s)."""
    s = grad + residual
    q = codec.decode(codec.encode(s), s.size)
    return q, s - q


@pytest.mark.parametrize("codec", NAMES)
def test_fused_error_feedback_matches_the_composition(codec, cpu_path):
    """error_feedback_round's one C++ pass (kernels/cpu_error_feedback.cc: int8/int4 nearest in its
    own loop, the rest through the codec per chunk) gives the bits of the whole-buffer composition,
    with and without a residual, on the awkward data (NaN/Inf blocks and sums that overflow take
    the codec's own path) and on counts that end inside a chunk or a block; with ``src=`` (the
    gradient in memory of its own, grad only written) the same bits."""
    from commlib.core.codecs import error_feedback_round
    with np.errstate(over="ignore", invalid="ignore"):
        for _, c, count, label in codec_cases(codec, COUNTS + (5003,), 3, BLOCKS, dtypes=("float32",)):
            grad = awkward(count, count + c.block_size)
            residual = (sample(count, count + 7) * np.float32(0.01)).astype(np.float32)
            if count > 3:
                residual[3] = np.float32(3.4e38)  # s = grad + residual may pass float32's largest
            for res in (None, residual):
                want_q, want_r = feedback_reference(c, grad, np.zeros_like(grad) if res is None else res)
                g, r = grad.copy(), None if res is None else res.copy()
                r = error_feedback_round(c, g, r)
                what = f"{label} residual {res is not None}"
                assert np.array_equal(g.view(np.uint32), want_q.view(np.uint32)), f"{what}: grad differs"
                same = (r.view(np.uint32) == want_r.view(np.uint32)) | (np.isnan(r) & np.isnan(want_r))
                assert same.all(), f"{what}: residual differs at {np.nonzero(~same)[0][:5]}"
                # src=: the gradient read from its own memory, grad only written (DataParallel's copy)
                g2, r2 = np.full_like(grad, np.nan), (np.zeros_like(grad) if res is None else res.copy())
                error_feedback_round(c, g2, r2, src=grad)
                assert np.array_equal(g2.view(np.uint32), want_q.view(np.uint32)), f"{what}: grad from src differs"
                same = (r2.view(np.uint32) == want_r.view(np.uint32)) | (np.isnan(r2) & np.isnan(want_r))
                assert same.all(), f"{what}: residual from src differs"


@pytest.mark.parametrize("codec", NAMES)
def test_projection_in_place_matches_encode_then_decode(codec, cpu_path):
    """codec_project (the compressed lowering's projection of a sum: int8/int4 nearest on float32
    in error feedback's loop, the rest through the codec) leaves the bits decode(encode(x)) gives,
    for every dtype x block size x rounding, NaN/Inf blocks and counts inside a block included."""
    from commlib.core import call_spec
    with np.errstate(over="ignore", invalid="ignore"):
        for dtype, c, count, what in codec_cases(codec, COUNTS, 5, BLOCKS):
            x = as_dtype(awkward(count, count + 2 * c.block_size), dtype)
            want = c.decode(c.encode(x, dtype, counter_base=9), count, dtype)
            got = x.copy()
            _C.codec_project(codec, c.block_size, c.rounding, 5, call_spec.dtype(dtype), got, 9)
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{what}: projection differs"


@pytest.mark.parametrize("codec", NAMES)
def test_encode_with_projection_matches_encode_then_decode(codec, cpu_path):
    """codec_encode_project (a send's encoding and the sender's projection in one pass: int8/int4
    nearest on float32 write each block's decoded values as they code it) gives encode's bytes and
    leaves decode(encode(x)) in x, bit for bit, NaN/Inf blocks and counts inside a block included."""
    from commlib.core import call_spec
    with np.errstate(over="ignore", invalid="ignore"):
        for dtype, c, count, what in codec_cases(codec, COUNTS, 5, BLOCKS):
            x = as_dtype(awkward(count, count + 3 * c.block_size), dtype)
            want_bytes = c.encode(x, dtype, counter_base=9)
            want = c.decode(want_bytes, count, dtype)
            got = x.copy()
            got_bytes = _C.codec_encode_project(codec, c.block_size, c.rounding, 5, call_spec.dtype(dtype), got, 9)
            assert np.array_equal(got_bytes, want_bytes), f"{what}: bytes differ"
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{what}: projection differs"


def test_error_feedback_src_refusals_name_src():
    """error_feedback_round(src=): a gradient of another size, or one overlapping the residual or
    part of grad, is refused naming src before anything is written; src may be grad itself."""
    from commlib.core.codecs import error_feedback_round
    c = Codec("int8")
    grad, residual = np.ones(64, np.float32), np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="src"):
        error_feedback_round(c, grad, residual, src=np.ones(63, np.float32))
    with pytest.raises(ValueError, match="src: overlaps residual"):
        error_feedback_round(c, grad, residual, src=residual)
    buf = np.ones(96, np.float32)
    with pytest.raises(ValueError, match="src: overlaps grad"):
        error_feedback_round(c, buf[:64], residual, src=buf[32:])
    assert (grad == 1).all() and (residual == 0).all() and (buf == 1).all()
    error_feedback_round(c, grad, residual, src=grad)  # in place, as without src
    assert np.array_equal(grad, np.ones(64, np.float32)) and (residual == 0).all()
