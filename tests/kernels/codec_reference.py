"""What the codec tests compare against: data in each coded dtype, its float32 values, the
per-block largest finite magnitude and the stated error bounds (docs/compression.md)."""
import numpy as np

# codec -> (grid top, fp8 mantissa bits or None, exponent of the fp8 grid's smallest subnormal)
GRIDS = {"int8": (127.0, None, 0), "int4": (7.0, None, 0), "fp8_e4m3": (448.0, 3, -9), "fp8_e5m2": (57344.0, 2, -16)}
DTYPES = ("float32", "float16", "bfloat16")


def codec_cases(codec: str, counts, seed: int, blocks, dtypes=DTYPES):
    """Every case of a codec test: (dtype, Codec, count, label) over dtypes x block sizes (bf16
    has its one) x both roundings x counts, the label naming the case in a failure."""
    from commlib.codecs import Codec
    for dtype in dtypes:
        for block in blocks if codec != "bf16" else (32,):
            for rounding in ("nearest", "stochastic"):
                c = Codec(codec, block, rounding, seed=seed)
                for count in counts:
                    yield dtype, c, count, f"{codec} {dtype} block {block} {rounding} n={count}"


def as_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in dtype's host representation (bfloat16: rounded bit patterns as uint16)."""
    v = np.asarray(values, dtype=np.float32)
    if dtype == "float32":
        return v.copy()
    if dtype == "float16":
        return v.astype(np.float16)
    u = v.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def to_float(x: np.ndarray) -> np.ndarray:
    """float32 values of a float32/float16 array or of bfloat16 bit patterns (uint16)."""
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def block_amax(xf: np.ndarray, block: int) -> np.ndarray:
    """Per element: the largest finite magnitude of its block."""
    a = np.where(np.isfinite(xf), np.abs(xf), 0).astype(np.float64)
    out = np.empty_like(a)
    for b0 in range(0, a.size, block):
        out[b0:b0 + block] = a[b0:b0 + block].max()
    return out


def error_bound(codec: str, xf: np.ndarray, block: int, stochastic: bool) -> np.ndarray:
    """The stated bound on |decode(encode(x)) - x| per element (docs/compression.md)."""
    x = np.abs(xf.astype(np.float64))
    if codec == "bf16":
        return x * (2.0 ** -7 if stochastic else 2.0 ** -8)
    top, mbits, qexp = GRIDS[codec]
    amax = block_amax(xf, block)
    if mbits is None:  # one grid step (stochastic) or half of one (nearest); a step < 2 amax / top
        return amax / top * (2.0 if stochastic else 1.0)
    step_scale = 4.0 * amax / top  # 2^e, loosely (the scale is within a factor 4 of amax / top)
    rel = 2.0 ** -(mbits if stochastic else mbits + 1)
    return rel * x + 2.0 ** qexp * step_scale * (1.0 if stochastic else 0.5)


def sample(count: int, seed: int) -> np.ndarray:
    """Normal values with magnitudes spread over many binades, so blocks differ in scale."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count) * np.exp(rng.uniform(-4, 4, count))).astype(np.float32)


def awkward(count: int, seed: int) -> np.ndarray:
    """sample()'s spread of magnitudes, then stretches of special values: exact ties of the
    integer grids (k + 1/2 times a block's power of two), tiny values (fp8 and dtype subnormals),
    values near float16's and float32's largest, NaN, +-Inf and +-0."""
    x = sample(count, seed)
    rng = np.random.default_rng(seed + 1)
    specials = np.concatenate([
        (np.arange(-8, 9) + 0.5).astype(np.float32) * 2.0 ** rng.integers(-20, 20),
        np.float32(2.0 ** -140) * np.arange(1, 9, dtype=np.float32),
        np.array([6e-8, -6e-8, 1e-39, -1e-45, 65504, -65504, 65519, 3.3e38, -3.4e38], np.float32),
        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32),
    ])
    for k in range(0, count, 211):  # a few stretches, leaving most blocks plain
        m = min(specials.size, count - k)
        x[k:k + m] = rng.permutation(specials)[:m]
    return x
