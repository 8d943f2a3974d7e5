"""Device buffers and their route to the stream engine (csrc/engine/stream_engine.h).

``device_buffer(x)`` recognises buffers that live on a device: ``commlib.emulated`` arrays, and
CUDA memory of any library through ``__cuda_array_interface__`` (CuPy, Numba, torch), DLPack
(``__dlpack__``/``__dlpack_device__``) or torch CUDA tensors; CUDA buffers go to the CUDA device
of ``commlib._C_cuda`` (a thin layer that has never run on a GPU so far). ``Communicator`` sends every call
whose buffers are on a device here, to one stream engine per (communicator, device), created on
the first such call (a collective step: the ranks exchange their engine handles through the
store). The call is enqueued on the caller's current stream (or ``stream=``) and returns; the
buffers are kept alive until the stream has executed it.
"""
from __future__ import annotations

import collections
import ctypes
import sys
from typing import NamedTuple, Optional

import numpy as np

from commlib import _C

_TYPESTR = {"<f4": "float32", "<f8": "float64", "<f2": "float16", "|i1": "int8", "<i1": "int8",
            "|u1": "uint8", "<u1": "uint8", "<i4": "int32", "<i8": "int64"}
_TORCH_DTYPES = {"torch.float32": "float32", "torch.float64": "float64", "torch.float16": "float16",
                 "torch.bfloat16": "bfloat16", "torch.int8": "int8", "torch.uint8": "uint8",
                 "torch.int32": "int32", "torch.int64": "int64"}
# DLPack type codes (dlpack.h): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4; devices kDLCUDA 2,
# kDLCUDAManaged 13.
_DLPACK_DTYPES = {(2, 32): "float32", (2, 64): "float64", (2, 16): "float16", (4, 16): "bfloat16",
                  (0, 8): "int8", (1, 8): "uint8", (0, 32): "int32", (0, 64): "int64"}
_DL_CUDA = (2, 13)


class DeviceBuffer(NamedTuple):
    kind: str          # "emulated" or "cuda"
    ptr: int
    count: int
    dtype: str
    device_index: int


def _is_contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _from_dlpack(x, name):
    capsule = x.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    dt = _DLPACK_DTYPES.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dt is None:
        raise TypeError(f"{name}: unsupported DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits)")
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = None if not t.strides else [t.strides[i] * (t.dtype.bits // 8) for i in range(t.ndim)]
    if not _is_contiguous(shape, strides, t.dtype.bits // 8):
        raise ValueError(f"{name}: CUDA array must be contiguous")
    count = 1
    for n in shape:
        count *= n
    return DeviceBuffer("cuda", (t.data or 0) + t.byte_offset, count, dt, t.device.device_id)


def device_buffer(x, name: str = "tensor") -> Optional[DeviceBuffer]:
    """The device description of ``x``, or None for host buffers (NumPy, torch CPU, None)."""
    if x is None or type(x) is np.ndarray:
        return None
    from commlib.emulated import Array
    if isinstance(x, Array):
        return DeviceBuffer("emulated", x.data_ptr(), x.count, x.dtype, x.device_index)
    if type(x).__module__.startswith("torch") and hasattr(x, "device"):
        if x.device.type != "cuda":
            return None
        dt = _TORCH_DTYPES.get(str(x.dtype))
        if dt is None:
            raise TypeError(f"{name}: unsupported dtype {x.dtype}")
        if not x.is_contiguous():
            raise ValueError(f"{name}: tensor must be contiguous (call .contiguous())")
        return DeviceBuffer("cuda", x.data_ptr(), x.numel(), dt, x.device.index or 0)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        dt = _TYPESTR.get(cai["typestr"])
        if dt is None:
            raise TypeError(f"{name}: unsupported CUDA array typestr {cai['typestr']!r}")
        shape = tuple(cai["shape"])
        if not _is_contiguous(shape, cai.get("strides"), _C.dtype_size(dt)):
            raise ValueError(f"{name}: CUDA array must be C-contiguous")
        count = 1
        for n in shape:
            count *= n
        return DeviceBuffer("cuda", int(cai["data"][0] or 0), count, dt, 0)
    dl_device = getattr(x, "__dlpack_device__", None)
    if dl_device is not None and hasattr(x, "__dlpack__"):
        kind, _ = dl_device()
        if int(kind) in _DL_CUDA:
            return _from_dlpack(x, name)
    return None


class DeviceWork:
    """Handle of a call enqueued on a device stream (like torch's NCCL work).

    ``wait()`` makes the current stream (or ``stream``) wait for the call and returns at once;
    ``synchronize()`` blocks the host until the call has executed and raises its CommError;
    ``is_completed()`` polls.
    """

    __slots__ = ("_work", "_refs", "_stream_of")

    def __init__(self, work, refs, stream_of):
        self._work = work
        self._refs = refs
        self._stream_of = stream_of  # stream argument (None: current) -> the engine's stream

    def wait(self, timeout=None, stream=None) -> bool:
        self._work.wait(self._stream_of(stream))
        return True

    def synchronize(self):
        self._work.synchronize()
        self._refs = None

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def exception(self):
        if not self._work.is_completed():
            return None
        try:
            self._work.synchronize()
        except Exception as e:  # noqa: BLE001 - returned, not raised
            return e
        return None


def _cuda_module(name):
    try:
        import commlib._C_cuda as cu
    except ImportError as e:
        raise RuntimeError(f"{name}: is CUDA memory, but commlib._C_cuda is not usable here ({e})") from None
    return cu


def _current_cuda_stream(index) -> int:
    """The caller's current CUDA stream: torch's, else CuPy's, else the legacy default stream."""
    if "torch" in sys.modules:
        return sys.modules["torch"].cuda.current_stream(index).cuda_stream
    if "cupy" in sys.modules:
        return sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0


def stream_resolver(buf: DeviceBuffer):
    """A function mapping a ``stream=`` argument (None: the current stream) to the engine's
    stream object for buffers like ``buf``."""
    if buf.kind == "emulated":
        from commlib import emulated

        def emulated_stream(stream):
            if stream is None:
                return emulated.current_stream(buf.device_index)._stream
            if not isinstance(stream, emulated.Stream):
                raise TypeError(f"stream: expected a commlib.emulated.Stream, got {type(stream).__name__}")
            return stream._stream
        return emulated_stream
    cu = _cuda_module("tensor")

    def cuda_stream(stream):
        if stream is None:
            ptr = _current_cuda_stream(buf.device_index)
        elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
            ptr = stream.cuda_stream
        elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
            ptr = stream.ptr
        elif isinstance(stream, int):
            ptr = stream
        else:
            raise TypeError(f"stream: expected a torch.cuda.Stream, CuPy stream or cudaStream_t, "
                            f"got {type(stream).__name__}")
        return _C.stream_from_capsule(cu.stream_capsule(buf.device_index, int(ptr)))
    return cuda_stream


class DeviceRoute:
    """The stream engines of one communicator, one per device, and the calls still in flight."""

    def __init__(self, comm):
        self._comm = comm
        self._engines = {}
        self._pending = collections.deque()  # (work, refs): buffers stay alive until executed

    def _engine(self, buf: DeviceBuffer):
        key = (buf.kind, buf.device_index)
        engine = self._engines.get(key)
        if engine is not None:
            return engine
        if buf.kind == "emulated":
            from commlib import emulated
            device = emulated.device(buf.device_index)
        else:  # CUDA: the thin layer of commlib._C_cuda (never run so far: docs/gpu.md)
            device = _C.device_from_capsule(_cuda_module("tensor").device_capsule(buf.device_index))
        from commlib.init import _Rendezvous
        c = self._comm
        rdv = _Rendezvous(c._store, f"{c._prefix}/device{len(self._engines) + 1}", c.rank, c.timeout)
        try:
            engine = _C.StreamEngine(c._core, device, c.timeout, c._prefix)
            rdv.set(str(c.rank), engine.local_handle())
            engine.connect([rdv.wait(str(r), f"rank {r}'s stream engine").decode() for r in range(c.size)])
        except Exception as e:
            rdv.report(f"{type(e).__name__}: {e}")  # the other ranks stop waiting for this one
            raise
        self._engines[key] = engine
        return engine

    def run(self, coll, algorithm, bufs, in_ptr, out_ptr, count, dtype, op, root, scale, async_op,
            stream, refs):
        """Enqueue one collective whose buffers (``bufs``: (argument name, DeviceBuffer)) are on a
        device; return a DeviceWork when ``async_op``."""
        first_name, first = bufs[0]
        for name, b in bufs[1:]:
            if (b.kind, b.device_index) != (first.kind, first.device_index):
                raise ValueError(f"{name}: is on {b.kind}:{b.device_index} but {first_name} on "
                                 f"{first.kind}:{first.device_index}")
        stream_of = stream_resolver(first)
        device_stream = stream_of(stream)  # checks `stream` before the engine rendezvous
        engine = self._engine(first)
        work = engine.run(coll, algorithm, in_ptr, out_ptr, count, dtype, op, root, scale, device_stream)
        while self._pending and self._pending[0][0].is_completed():
            self._pending.popleft()
        self._pending.append((work, refs))
        return DeviceWork(work, refs, stream_of) if async_op else None

    def abort(self, reason):
        for e in self._engines.values():
            e.abort(reason)

    def close(self):
        for e in self._engines.values():
            e.close()
        self._engines.clear()
        self._pending.clear()
