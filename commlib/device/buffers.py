"""Recognition of device buffers (the route to the stream engine is commlib/core/device_route.py).

``device_buffer(x)`` recognises buffers that live on a device: ``commlib.emulated`` arrays, and
CUDA memory of any library through ``__cuda_array_interface__`` (CuPy, Numba, torch), DLPack
(``__dlpack__``/``__dlpack_device__``) or torch CUDA tensors. Contiguity, dtype and element count
are checked here, naming the argument. An emulated array describes itself (``__commlib_device__``),
so this module imports nothing above it.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple, Optional

import numpy as np

import commlib._C as _C
from commlib.device import dtypes

_TYPESTR = dtypes.TYPESTR
_TORCH_DTYPES = dtypes.TORCH
# DLPack devices: kDLCUDA 2, kDLCUDAManaged 13.
_DLPACK_DTYPES = dtypes.DLPACK
_DL_CUDA = (2, 13)


class DeviceBuffer(NamedTuple):
    kind: str          # "emulated" or "cuda"
    ptr: int
    count: int
    dtype: str
    device_index: int
    # The stream the data is valid on, from __cuda_array_interface__'s "stream" key (a
    # cudaStream_t; 1 and 2: the legacy and per-thread default streams), or None: the caller's
    # current stream (torch's for torch tensors).
    stream: Optional[int] = None


def _pointer_device(ptr: int) -> int:
    """The CUDA device of a pointer (its attributes), 0 where that cannot be asked (no usable
    commlib._C_cuda: the route refuses the buffer later with the reason)."""
    try:
        import commlib._C_cuda as cu
    except ImportError:
        return 0
    d = cu.pointer_device(int(ptr)) if ptr else 0
    return d if d >= 0 else 0


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
    own = getattr(type(x), "__commlib_device__", None)  # commlib.emulated.Array
    if own is not None:
        return DeviceBuffer(*own.__get__(x))
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
        if not _is_contiguous(shape, cai.get("strides"), dtypes.SIZE[dt]):
            raise ValueError(f"{name}: CUDA array must be C-contiguous")
        count = 1
        for n in shape:
            count *= n
        ptr = int(cai["data"][0] or 0)
        # The device of the memory, not device 0; the producer's stream (CuPy's current stream,
        # never torch's): version 3 of the interface says which stream the data is valid on.
        stream = cai.get("stream")
        return DeviceBuffer("cuda", ptr, count, dt, _pointer_device(ptr) if ptr else 0,
                            0 if stream is None else int(stream))
    dl_device = getattr(x, "__dlpack_device__", None)
    if dl_device is not None and hasattr(x, "__dlpack__"):
        kind, _ = dl_device()
        if int(kind) in _DL_CUDA:
            return _from_dlpack(x, name)
    return None


