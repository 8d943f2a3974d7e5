"""collective_cases' buffer factory for torch CUDA tensors (every rank on GPU 0), so the device
collective matrix of test_device_collectives.py runs on a real GPU (test_cuda_ranks.py)."""
from __future__ import annotations

import numpy as np

import device_cases
from device_cases import BF16, cc


def _torch():
    import torch
    torch.cuda.set_device(0)
    return torch


class CudaBuffers:
    """Tensors on GPU 0 (bfloat16 from and to collective_cases' BF16 bit patterns)."""

    @staticmethod
    def make(dtype, v):
        torch = _torch()
        a = cc.make(dtype, v)
        if dtype == "bfloat16":
            return torch.from_numpy(np.asarray(a).view(np.int16).copy()).view(torch.bfloat16).to("cuda")
        return torch.from_numpy(np.ascontiguousarray(a)).to("cuda")

    @staticmethod
    def empty(dtype, n):
        """Pre-filled with collective_cases' poison, so unwritten elements show."""
        a = cc.empty(dtype, n)
        torch = _torch()
        if dtype == "bfloat16":
            return torch.from_numpy(np.asarray(a).view(np.int16).copy()).view(torch.bfloat16).to("cuda")
        return torch.from_numpy(np.ascontiguousarray(a)).to("cuda")

    @staticmethod
    def to_host(t, dtype):
        torch = _torch()
        if dtype == "bfloat16":
            return t.view(torch.int16).cpu().numpy().view(np.uint16).view(BF16)
        return t.cpu().numpy()

    @staticmethod
    def assign(dst, src):
        dst.copy_(src)


def check_cases(comm, cases):
    """device_cases.check_cases with CUDA tensors instead of emulated arrays."""
    saved = device_cases.DeviceBuffers
    device_cases.DeviceBuffers = CudaBuffers
    try:
        return device_cases.check_cases(comm, cases)
    finally:
        device_cases.DeviceBuffers = saved
