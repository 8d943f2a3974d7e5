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

import functools
from dataclasses import dataclass

import numpy as np

import commlib._C as _C
from commlib.core import call_spec
from commlib.device import dtypes

NAMES = ("bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
ROUNDINGS = ("nearest", "stochastic")
CODED_DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_BLOCK = 32
# One nearest-rounded encoding's error relative to its block's largest finite magnitude
# (docs/compression.md's table; stochastic rounding: twice these). A compressed all_reduce over P
# ranks stays within (P + 1) x (this + the dtype's rounding) x the largest sum of magnitudes.
ERROR_BOUND = {"bf16": 2 ** -8, "fp8_e4m3": 2 ** -4 + 2 ** -9, "fp8_e5m2": 2 ** -3 + 2 ** -16, "int8": 1 / 127,
               "int4": 1 / 7}
DTYPE_EPS = {"float32": 2 ** -23, "float16": 2 ** -10, "bfloat16": 2 ** -7}  # one addition's rounding
COMPRESSIBLE = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Codec:
    """A codec: ``name`` (one of :data:`NAMES`), ``block_size`` elements per scale (bf16 has no
    scales), ``rounding`` ("nearest", ties to even, or "stochastic", reproducible from ``seed``:
    element i of an encoded region draws from a counter-based hash of (seed, i, its value)).
    ``inter_only`` (compress_inter_only): only messages between hosts are encoded; those between
    ranks of one host travel raw (hierarchical schedules' intra-host phases stay exact)."""

    name: str
    block_size: int = DEFAULT_BLOCK
    rounding: str = "nearest"
    seed: int = 0
    inter_only: bool = False

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"compress: unknown codec {self.name!r} (one of {', '.join(NAMES)})")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or not 1 <= self.block_size <= 1 << 24:
            raise ValueError(f"block_size: an int in [1, 2**24], got {self.block_size!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding: 'nearest' or 'stochastic', got {self.rounding!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed: an int in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.inter_only, bool):
            raise TypeError(f"inter_only: a bool, got {type(self.inter_only).__name__}")

    def encoded_size(self, count: int) -> int:
        """Bytes that ``count`` elements encode to (scales + codes)."""
        return int(_C.codec_encoded_bytes(self.name, self.block_size, int(count)))

    def encode(self, x, dtype: str | None = None, counter_base: int = 0, reference: bool = False) -> np.ndarray:
        """The bytes of ``x`` (a contiguous float32/float16 array, or bfloat16 bit patterns as
        uint16 with ``dtype="bfloat16"``). ``counter_base`` numbers the first element for
        stochastic rounding. ``reference``: through the scalar functors (codecs.h) one element at
        a time instead of the vectorised loops (the same bytes; tests compare them)."""
        arr, name = _coded_array(x, dtype)
        return _C.codec_encode(self.name, self.block_size, self.rounding, self.seed, call_spec.dtype(name),
                               arr, int(counter_base), bool(reference))

    def decode(self, data, count: int, dtype: str = "float32", reference: bool = False) -> np.ndarray:
        """``count`` elements of ``dtype`` decoded from ``data`` (bfloat16: uint16 bit patterns);
        ``reference`` as :meth:`encode`'s."""
        if dtype not in CODED_DTYPES:
            raise ValueError(f"dtype: codecs decode to {', '.join(CODED_DTYPES)}, not {dtype!r}")
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"count: a non-negative int, got {count!r}")
        out = np.empty(int(count), dtype=dtypes.HOST_NUMPY[dtype])
        _C.codec_decode(self.name, self.block_size, call_spec.dtype(dtype),
                        np.ascontiguousarray(data, dtype=np.uint8), out, bool(reference))
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


def compressed_call(core, size: int, coll: str, algorithm: str, count: int, dtype: str, compress):
    """The :class:`Codec` and the algorithm of a collective with ``compress=`` (on host or device
    buffers alike: both engines run the same lowering); refuses what no codec can code, and an
    algorithm the verifier does not prove keeps every rank identical, naming the argument, before
    anything is sent."""
    codec = get(compress)
    if dtype not in CODED_DTYPES:
        raise ValueError(f"compress: codecs code {', '.join(CODED_DTYPES)} data, not {dtype}")
    host_of = tuple(core.host_of)
    if algorithm == "auto":
        # ring: proved for every size; inter_only across hosts: hierarchical (whose intra-host
        # phases are what it keeps exact), else ring, whichever the verifier proves first.
        hosts = len(set(host_of))
        tried = ("hierarchical", "ring") if codec.inter_only and 1 < hosts < size else ("ring",)
        refused = [(a, _identity_refused(coll, a, size, count, host_of, codec.inter_only)) for a in tried]
        algorithm, reason = next(((a, r) for a, r in refused if not r), refused[-1])
    else:
        reason = _identity_refused(coll, algorithm, size, count, host_of, codec.inter_only)
    if reason:
        what = "compress_inter_only (Codec(inter_only=True)) on this host map" if codec.inter_only else "compress="
        raise ValueError(f"algorithm: {algorithm} cannot keep every rank's {coll} identical under {what} "
                         f"on {size} ranks and {count} elements ({reason}); "
                         f"{'try another algorithm or compress everything' if codec.inter_only else 'ring can'}")
    return codec, algorithm


def run_compressed(core, coll: str, algorithm: str, in_ptr: int, out_ptr: int, count: int, dtype: str, op: str,
                   root: int, scale: float, async_op: bool, codec: Codec):
    """Runs a host collective whose messages travel encoded with ``codec`` (the Communicator's
    collectives call it after their own checks and :func:`compressed_call`; device buffers go to
    the stream engine instead, core/device_route.py)."""
    return _C.run_compressed(core, call_spec.collective(coll), algorithm, in_ptr, out_ptr, count,
                             call_spec.dtype(dtype), call_spec.op(op), root, scale, async_op, codec.name,
                             codec.block_size, codec.rounding, codec.seed, codec.inter_only)


@functools.lru_cache(maxsize=512)
def _identity_refused(coll: str, algorithm: str, size: int, count: int, host_of: tuple, inter_only: bool) -> str:
    """Why the verifier rejects this schedule under a codec ("" if it proves it): every rank
    reaches the same verdict, so all refuse alike before anything is sent. auto runs ring, which
    the verifier proves for every size (docs/compression.md)."""
    try:
        verify(coll, algorithm, size, count, host_of=list(host_of), inter_only=inter_only)
    except _C.VerificationError as e:
        return str(e).split(": ", 1)[-1]
    return ""


def verify(collective: str, algorithm: str = "auto", size: int = 1, count: int = 0,
           sender_projects: bool = True, host_of=None, inter_only: bool = False) -> str:
    """Proves ``algorithm``'s schedules for ``collective`` on ``size`` ranks and ``count`` elements
    as compress= runs them (docs/compression.md): the usual results, and every rank's output
    identical element by element, with a codec modelled as an idempotent projection Q.
    ``sender_projects=False`` models a lowering whose senders keep the value they encoded
    (rejected: ranks would hold v and Q(v)). ``host_of``: each rank's host (default: one host), for
    the hierarchical schedules; ``inter_only``: as :class:`Codec`'s (messages within a host raw).
    Returns the algorithm verified; raises ``commlib.VerificationError``."""
    return _C.verify_compressed(call_spec.collective(collective), algorithm, int(size), int(count),
                                bool(sender_projects), list(host_of or []), bool(inter_only))


def error_feedback_round(codec: Codec, grad, residual=None, src=None):
    """One error-feedback step (EF-SGD: Seide et al.'s 1-bit SGD, Karimireddy et al. 2019) on a
    flat, contiguous float32 buffer (a torch tensor or a NumPy array; on a device: a CUDA tensor
    or emulated array, core/device_feedback.py, enqueued on its current stream), in place: ``s = grad +
    residual`` (zeros if None), ``grad = Q(s)`` (``codec``'s projection, decode(encode(s)) with the
    codec's rounding, elements numbered from 0), ``residual = s - Q(s)`` (what Q dropped). Returns
    the residual: ``residual`` itself, updated, or a new zeroed buffer like ``grad`` on the first
    call. One fused C++ pass (kernels/cpu_error_feedback.h), bit for bit the composition. ``src``
    (host buffers only; same size as ``grad``, grad itself or memory of its own): the gradient is
    read from ``src`` instead, ``s = src + residual``, so copying a gradient into its bucket and
    feeding it back is one pass (DataParallel's gradient hook). Used by
    DataParallel(compress=, error_feedback=True) and commlib.torch.hooks; docs/compression.md says
    which combinations converge."""
    from commlib.device.buffers import device_buffer
    if device_buffer(grad, "grad") is not None:  # CUDA tensors, emulated arrays: the device's kernels
        if src is not None:
            raise ValueError("src: host buffers only (on a device, copy the gradient into grad first)")
        from commlib.core.device_feedback import error_feedback_on_device
        return error_feedback_on_device(codec, grad, residual)
    if residual is None:
        residual = grad.new_zeros(grad.shape) if hasattr(grad, "new_zeros") else np.zeros_like(grad)
    _C.codec_error_feedback(codec.name, codec.block_size, codec.rounding, codec.seed, _host_array(grad, "grad"),
                            _host_array(residual, "residual"), 0, None if src is None else _host_array(src, "src"))
    return residual


def _host_array(x, name: str):
    """``x`` as a NumPy array on its memory (a CPU tensor's ``.detach().numpy()``: shared, not
    copied); what the buffer reader cannot take it refuses naming ``name``."""
    if isinstance(x, np.ndarray):
        return x
    detach = getattr(x, "detach", None)
    if detach is None:
        raise TypeError(f"{name}: a CPU float32 tensor or NumPy array, not {type(x).__name__}")
    try:
        return detach().numpy()
    except (TypeError, RuntimeError) as e:  # on a device, or a dtype NumPy lacks
        raise TypeError(f"{name}: a CPU float32 tensor or NumPy array ({e})") from None
