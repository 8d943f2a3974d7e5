"""Recognition of device buffers (the route to the stream engine is commlib/core/device_route.py).

``device_buffer(x)`` recognises buffers that live on a device: ``commlib.emulated`` arrays, torch
CUDA tensors, and device memory of any library through ``__cuda_array_interface__`` (CuPy, Numba)
or DLPack (``__dlpack__``/``__dlpack_device__``), read by the C++ entry's own reader
(csrc/bindings/foreign_arrays.cc: memory the emulated device holds is ``emulated``). Contiguity,
dtype, writability and element count are checked, naming the argument. An emulated array
describes itself (``__commlib_device__``), so this module imports nothing above it.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

import commlib._C as _C
from commlib.device import dtypes

_TORCH_DTYPES = dtypes.TORCH


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
    # __cuda_array_interface__ and DLPack: the C++ entry's own reader (csrc/bindings/foreign_arrays.cc),
    # which raises naming ``name`` for a layout, dtype, read-only memory or device no collective takes.
    found = _C.read_device_array(x, name)
    if found is None:
        return None
    kind, ptr, count, dt, index, stream = found
    return DeviceBuffer(kind, ptr, count, dt.name, index, stream)


def parse_device(device):
    """(kind, index) of a ``device=`` argument: "cuda", "cuda:N", "emulated", "emulated:N", a
    torch.device, or a device buffer (its device)."""
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind in ("cuda", "emulated") and (index == "" or index.isdigit()):
            return kind, int(index or 0)
        raise ValueError(f"device: expected 'cuda[:N]' or 'emulated[:N]', got {device!r}")
    if type(device).__module__.startswith("torch") and hasattr(device, "type") and hasattr(device, "index"):
        if device.type != "cuda":
            raise ValueError(f"device: a stream engine needs a CUDA device, got {device}")
        return "cuda", device.index or 0
    buf = device_buffer(device, "device")
    if buf is None:
        raise TypeError(f"device: expected a device name, torch.device or device buffer, got {type(device).__name__}")
    return buf.kind, buf.device_index
