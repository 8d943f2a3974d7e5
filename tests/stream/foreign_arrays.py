"""Device arrays of "another library" over emulated memory, for the tests of the C++ entry's reader
of __cuda_array_interface__ and DLPack (csrc/bindings/foreign_arrays.cc): they expose an
emulated array's memory only through the interfaces, as a CuPy or Numba array (CudaArrayView) or
any DLPack exporter on a CUDA device (DLPackView) exposes its own, so the tests exercise the same
path a CUDA array takes, without a GPU."""
import ctypes

import numpy as np

from commlib.device import dtypes

_NUMPY = {n: d for d, n in dtypes.NUMPY.items()}


class CudaArrayView:
    """``__cuda_array_interface__`` (version 3) over an emulated array: its pointer, its shape (or
    ``shape``), its typestr (or ``typestr``), ``strides`` in bytes, ``readonly``, a ``mask``."""

    def __init__(self, array, shape=None, typestr=None, strides=None, readonly=False, mask=None, **extra):
        self.array = array  # keeps the memory alive
        cai = {"shape": tuple(shape or (array.count,)), "typestr": typestr or _NUMPY[array.dtype].str,
               "data": (array.data_ptr(), readonly), "strides": strides, "version": 3}
        if mask is not None:
            cai["mask"] = mask
        cai.update(extra)
        self.__cuda_array_interface__ = cai


# dlpack.h (1.0)
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAMES = {True: ctypes.c_char_p(b"dltensor_versioned"), False: ctypes.c_char_p(b"dltensor")}  # live as long as capsules
DL_CUDA, DL_CUDA_HOST = 2, 3
READ_ONLY, IS_COPIED = 1, 2


class DLPackView:
    """A DLPack exporter on "CUDA device" ``device_id`` (default: the array's emulated device) over
    an emulated array: a 1.0 capsule with ``flags`` when ``versioned`` (and the caller asks for
    max_version), else a 0.x one whose ``__dlpack__`` takes only ``stream``. ``strides`` in elements,
    ``shape``, ``dtype`` ((code, bits)) override the array's. ``streams``: the streams asked for."""

    def __init__(self, array, device_type=DL_CUDA, device_id=None, shape=None, strides=None, dtype=None,
                 flags=0, versioned=True):
        self.array = array
        self.device = (device_type, array.device_index if device_id is None else device_id)
        self.shape = tuple(shape or (array.count,))
        self.strides = strides
        self.dtype = dtype or next(k for k, n in dtypes.DLPACK.items() if n == array.dtype)
        self.flags = flags
        self.versioned = versioned
        self.streams = []
        self._kept = []  # the structures the capsules point at

    def __dlpack_device__(self):
        return self.device

    def _tensor(self, t):
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        strides = (ctypes.c_int64 * len(self.shape))(*self.strides) if self.strides else None
        t.data, t.ndim, t.byte_offset = self.array.data_ptr(), len(self.shape), 0
        t.device = _DLDevice(*self.device)
        t.dtype = _DLDataType(self.dtype[0], self.dtype[1], 1)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides else None
        return shape, strides

    def __dlpack__(self, stream=None, **kw):
        if kw and (not self.versioned or set(kw) != {"max_version"}):
            raise TypeError(f"__dlpack__() got unexpected keyword arguments {sorted(kw)}")
        self.streams.append(stream)
        versioned = self.versioned and kw.get("max_version", (0, 0))[0] >= 1
        m = _DLManagedTensorVersioned() if versioned else _DLManagedTensor()
        if versioned:
            m.major, m.minor, m.flags = 1, 0, self.flags
        arrays = self._tensor(m.dl_tensor)
        del self._kept[:-8]  # a reader drops each capsule once read: the last few suffice
        self._kept.append((m, arrays))
        return _new_capsule(ctypes.addressof(m), _NAMES[versioned], None)
