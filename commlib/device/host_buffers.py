"""Turns user arrays (NumPy arrays, torch CPU tensors) into (pointer, element count, dtype name).

The core never imports torch; this module recognises torch tensors by duck typing and only then
touches torch attributes. Validation errors name the argument the user passed.
"""
from __future__ import annotations

import numpy as np

from commlib.device import dtypes
from commlib.device.buffers import device_buffer
from commlib._C import buffer_address as _buffer_address
from commlib._C import describe_buffer as _describe_buffer
from commlib._C import register_array_type as _register_array_type

_register_array_type(np.ndarray)  # the C++ fast path accepts exactly this type

_NUMPY_DTYPES = dtypes.NUMPY
_TORCH_DTYPES = dtypes.TORCH


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def describe(x, name: str):
    """Return (data pointer, element count, dtype name) for a contiguous CPU array.

    Raises TypeError/ValueError naming ``name`` for unsupported types, dtypes, devices or layouts.
    """
    if type(x) is np.ndarray:
        fast = _describe_buffer(x)  # the common case in one C++ call; else explain below
        if fast is not None:
            return fast
    if isinstance(x, np.ndarray):
        dt = _NUMPY_DTYPES.get(x.dtype)
        if dt is None:
            if x.dtype.name == "bfloat16":  # ml_dtypes' bfloat16
                dt = "bfloat16"
            else:
                raise TypeError(f"{name}: unsupported dtype {x.dtype} (supported: "
                                f"{', '.join(sorted(set(_NUMPY_DTYPES.values()) | {'bfloat16'}))})")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name}: array must be C-contiguous")
        if not x.flags.writeable:
            raise ValueError(f"{name}: array must be writeable")
        return _buffer_address(x), x.size, dt
    dev = device_buffer(x, name)  # commlib.emulated arrays, CUDA memory: the stream engine's
    if dev is not None:
        return dev.ptr, dev.count, dev.dtype
    if _is_torch(x) and hasattr(x, "data_ptr"):
        dt = _TORCH_DTYPES.get(str(x.dtype))
        if dt is None:
            raise TypeError(f"{name}: unsupported dtype {x.dtype}")
        if x.device.type != "cpu":
            raise ValueError(f"{name}: tensor is on {x.device}; this build moves CPU tensors only")
        if not x.is_contiguous():
            raise ValueError(f"{name}: tensor must be contiguous (call .contiguous())")
        return x.data_ptr(), x.numel(), dt
    raise TypeError(f"{name}: expected a numpy.ndarray or torch.Tensor, got {type(x).__name__}")
