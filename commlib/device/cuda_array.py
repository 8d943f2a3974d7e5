"""A CUDA array that commlib owns: the symmetric pool's blocks on a CUDA device
(commlib/device/symmetric.py), handed to torch and CuPy without a copy.

It is what a caller gives to torch (``torch.as_tensor(a, device="cuda")`` through
``__cuda_array_interface__``, or ``torch.from_dlpack(a)``; ``a.torch()`` does the latter) or to
CuPy (``cupy.asarray(a)``, ``cupy.from_dlpack(a)``); commlib's collectives take it as it is. The
consumer's tensor keeps the block alive (both protocols hold a reference to this object). It
carries no stream: its data is valid in the order of the caller's streams, as a torch tensor's is
(the collectives run on the caller's current stream), so neither protocol names one. bfloat16 has
no ``__cuda_array_interface__`` spelling: such an array exports through DLPack only.
"""
from __future__ import annotations

import commlib._C as _C
from commlib.device import dtypes

_DLPACK_CODE = {name: code_bits for code_bits, name in dtypes.DLPACK.items()}
_TYPESTR = {name: d.str for d, name in dtypes.NUMPY.items()}
_KDL_CUDA = 2  # DLPack's device type of CUDA device memory


class CudaArray:
    """A C-contiguous array of ``shape`` and ``dtype`` in CUDA memory that ``_alloc`` (the block
    of a pool: its ``ptr``) owns."""

    __slots__ = ("_alloc", "device_index", "shape", "dtype", "__weakref__")

    def __init__(self, alloc, device_index: int, shape: tuple, dtype: str):
        self._alloc = alloc
        self.device_index = device_index
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return dtypes.SIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    def __len__(self):
        return self.shape[0] if self.shape else 1

    def data_ptr(self) -> int:
        """Device address of the first element."""
        return self._alloc.ptr

    @property
    def __commlib_device__(self):
        """(kind, address, elements, dtype, device index): how commlib/device/buffers.py sees it."""
        return ("cuda", self.data_ptr(), self.count, self.dtype, self.device_index)

    @property
    def __cuda_array_interface__(self) -> dict:
        typestr = _TYPESTR.get(self.dtype)
        if typestr is None:  # an AttributeError: consumers then try DLPack, which spells bfloat16
            raise AttributeError(f"__cuda_array_interface__: {self.dtype} has no typestr (use DLPack)")
        return {"shape": self.shape, "typestr": typestr, "data": (self.data_ptr(), False), "strides": None,
                "version": 3}

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the array (no copy; ``copy=True`` is refused). ``stream`` is
        accepted and not waited on: the array carries no stream of its own (see the module)."""
        if copy:
            raise BufferError("copy: a symmetric pool array is exported without a copy only")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"dl_device: the array is on {self.__dlpack_device__()}, got {dl_device}")
        code, bits = _DLPACK_CODE[self.dtype]
        return _C.dlpack_export(self, self.data_ptr(), list(self.shape), code, bits, _KDL_CUDA, self.device_index)

    def __dlpack_device__(self):
        return (_KDL_CUDA, self.device_index)

    def torch(self):
        """The array as a torch tensor on its CUDA device (``torch.from_dlpack``; shares the memory)."""
        import torch
        return torch.from_dlpack(self)

    def __repr__(self):
        return f"commlib.CudaArray(shape={self.shape}, dtype={self.dtype}, device=cuda:{self.device_index})"
