"""Block-wise quantization codecs (docs/compression.md), public as ``commlib.codecs``.

A :class:`Codec` names a codec of the C++ kernels (csrc/kernels/codecs.h) with its block size and
rounding. ``encode`` turns a float32, float16 or bfloat16 NumPy array into bytes (one
power-of-two scale per block, then one code per element), ``decode`` turns them back; the
collectives take the same objects (or a codec's name) as ``compress=``::

    codec = commlib.codecs.Codec("int8", block_size=64)
    data = codec.encode(x)                    # uint8 array of codec.encoded_size(x.size) bytes
    y = codec.decode(data, x.size, "float32") # |y - x| <= max|x in block| / 127, elementwise
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import commlib._C as _C
from commlib.core import call_spec
from commlib.device import dtypes

NAMES = ("bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
ROUNDINGS = ("nearest", "stochastic")
CODED_DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_BLOCK = 32


@dataclass(frozen=True)
class Codec:
    """A codec: ``name`` (one of :data:`NAMES`), ``block_size`` elements per scale (bf16 has no
    scales), ``rounding`` ("nearest", ties to even, or "stochastic", reproducible from ``seed``:
    element i of an encoded region draws from a counter-based stream of (seed, i))."""

    name: str
    block_size: int = DEFAULT_BLOCK
    rounding: str = "nearest"
    seed: int = 0

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"compress: unknown codec {self.name!r} (one of {', '.join(NAMES)})")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or not 1 <= self.block_size <= 1 << 24:
            raise ValueError(f"block_size: an int in [1, 2**24], got {self.block_size!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding: 'nearest' or 'stochastic', got {self.rounding!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed: an int in [0, 2**64), got {self.seed!r}")

    def encoded_size(self, count: int) -> int:
        """Bytes that ``count`` elements encode to (scales + codes)."""
        return int(_C.codec_encoded_bytes(self.name, self.block_size, int(count)))

    def encode(self, x, dtype: str | None = None, counter_base: int = 0) -> np.ndarray:
        """The bytes of ``x`` (a contiguous float32/float16 array, or bfloat16 bit patterns as
        uint16 with ``dtype="bfloat16"``). ``counter_base`` numbers the first element for
        stochastic rounding."""
        arr, name = _coded_array(x, dtype)
        return _C.codec_encode(self.name, self.block_size, self.rounding, self.seed, call_spec.dtype(name),
                               arr, int(counter_base))

    def decode(self, data, count: int, dtype: str = "float32") -> np.ndarray:
        """``count`` elements of ``dtype`` decoded from ``data`` (bfloat16: uint16 bit patterns)."""
        if dtype not in CODED_DTYPES:
            raise ValueError(f"dtype: codecs decode to {', '.join(CODED_DTYPES)}, not {dtype!r}")
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"count: a non-negative int, got {count!r}")
        out = np.empty(int(count), dtype=dtypes.HOST_NUMPY[dtype])
        _C.codec_decode(self.name, self.block_size, call_spec.dtype(dtype),
                        np.ascontiguousarray(data, dtype=np.uint8), out)
        return out

    def round_trip(self, x, dtype: str | None = None) -> np.ndarray:
        """decode(encode(x)), shaped like ``x``: what every rank holds after a compressed send."""
        arr, name = _coded_array(x, dtype)
        return self.decode(self.encode(arr, name), arr.size, name).reshape(arr.shape)


def get(compress) -> Codec | None:
    """The :class:`Codec` that ``compress=`` names: None, a codec's name or a Codec."""
    if compress is None or isinstance(compress, Codec):
        return compress
    if isinstance(compress, str):
        return Codec(compress)
    raise TypeError(f"compress: a codec name ({', '.join(NAMES)}) or a commlib.codecs.Codec, "
                    f"not {type(compress).__name__}")


def _coded_array(x, dtype: str | None):
    arr = np.asarray(x)
    if dtype is None:
        dtype = dtypes.NUMPY.get(arr.dtype, str(arr.dtype))
        if str(arr.dtype) == "bfloat16":  # ml_dtypes
            dtype, arr = "bfloat16", arr.view(np.uint16)
    if dtype not in CODED_DTYPES:
        raise ValueError(f"dtype: codecs take {', '.join(CODED_DTYPES)} data, not {dtype}")
    if arr.dtype != dtypes.HOST_NUMPY[dtype]:
        raise ValueError(f"x: holds {arr.dtype}, which is not how {dtype} lies in memory")
    return np.ascontiguousarray(arr), dtype
