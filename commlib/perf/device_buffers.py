"""Device buffers for the bench's sweep (``--device cuda|emulated``): allocate, fill, read back.

Apart from commlib/bench/device.py (the device backend and its report) so that the sweep's buffer
helpers in commlib/perf/common.py can reach them without importing the backend that builds on
the sweep.
"""
from __future__ import annotations

import numpy as np

def is_device_buffer(buf) -> bool:
    return hasattr(buf, "__commlib_device__") or bool(getattr(buf, "is_cuda", False))


def empty(device: str, count: int, dtype: str):
    if device == "emulated":
        from commlib.device import emulated
        return emulated.empty(count, dtype)
    import torch
    return torch.empty(count, dtype=getattr(torch, dtype), device="cuda")


def fill(buf, vals: np.ndarray, offset: int = 0):
    """buf[offset:offset+len(vals)] = vals on the device (ordered on the current stream)."""
    n = len(vals)
    if hasattr(buf, "__commlib_device__"):
        from commlib.device import emulated
        buf[offset:offset + n].copy_(emulated.from_numpy(vals.astype(np.dtype(buf.dtype))))
    else:
        import torch
        buf[offset:offset + n] = torch.from_numpy(vals).to(buf.dtype).to(buf.device)


def to_host(buf) -> np.ndarray:
    """float64 host copy (waits for the current stream, like .cpu())."""
    if hasattr(buf, "__commlib_device__"):
        return buf.numpy().astype(np.float64)
    return buf.float().cpu().numpy().astype(np.float64)
