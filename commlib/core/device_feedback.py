"""Error feedback's step on device buffers (CUDA tensors, ``commlib.emulated`` arrays), for the DDP
hook and FSDP2's reduce-scatter on the GPU (docs/compression.md "Error feedback on device
buffers"). The CPU's fused pass (csrc/kernels/cpu_error_feedback.h) composed of the device's own
operations, enqueued on the buffer's current stream, with the same values bit for bit:
``grad += residual`` (the reduction kernel: s), ``residual = s``, ``grad = decode(encode(s))`` (the
codec kernels, codecs.h's functors), ``residual += -grad`` (s - Q(s): a negation is exact)."""
from __future__ import annotations

import numpy as np

import commlib._C as _C
from commlib.core import call_spec
from commlib.device.buffers import DeviceBuffer, device_buffer


def _device(buf: DeviceBuffer):
    if buf.kind == "emulated":
        from commlib.device import emulated
        return emulated.device(buf.device_index)
    import commlib._C_cuda as cu
    return _C.device_from_capsule(cu.device_capsule(buf.device_index))


def _zeros_like(grad, buf: DeviceBuffer):
    if hasattr(grad, "new_zeros"):  # a torch CUDA tensor
        return grad.new_zeros(grad.shape)
    from commlib.device import emulated
    return emulated.from_numpy(np.zeros(buf.count, np.float32), device_index=buf.device_index)


def error_feedback_on_device(codec, grad, residual=None):
    """:func:`commlib.core.codecs.error_feedback_round` on a flat, contiguous float32 device
    buffer; ``residual`` on the same device (None: a zeroed one is made). Returns the residual."""
    from commlib.core.device_route import stream_resolver
    g = device_buffer(grad, "grad")
    if g.dtype != "float32":
        raise ValueError(f"grad: error feedback keeps float32 gradients and residuals, not {g.dtype}")
    if residual is None:
        residual = _zeros_like(grad, g)
    r = device_buffer(residual, "residual")
    if r is None or (r.kind, r.device_index) != (g.kind, g.device_index):
        raise ValueError(f"residual: must be on grad's device ({g.kind}:{g.device_index})")
    if r.dtype != "float32" or r.count != g.count:
        raise ValueError(f"residual: {r.count} x {r.dtype}, but grad is {g.count} x float32")
    if g.count and g.ptr < r.ptr + 4 * r.count and r.ptr < g.ptr + 4 * g.count:
        raise ValueError("residual: overlaps grad (each needs its own memory)")
    n = g.count
    if not n:
        return residual
    dev, s = _device(g), stream_resolver(g)(None)
    f32, add = call_spec.dtype("float32"), call_spec.op("sum")
    tmp, release = _temporary(grad, dev, s, max(codec.encoded_size(n), 4 * n))  # the codes, then -Q(s)
    dev.reduce(g.ptr, r.ptr, n, f32, add, s)                 # grad = s = grad + residual
    dev.copy(r.ptr, g.ptr, 4 * n, s)                         # residual = s
    dev.codec_encode(tmp, g.ptr, n, f32, codec.name, codec.block_size, codec.rounding, codec.seed, 0, s)
    dev.codec_decode(g.ptr, tmp, n, f32, codec.name, codec.block_size, s)  # grad = Q(s)
    dev.scale_copy(tmp, g.ptr, n, f32, -1.0, s)             # -Q(s)
    dev.reduce(r.ptr, tmp, n, f32, add, s)                   # residual = s - Q(s)
    release()
    return residual


def _temporary(grad, dev, s, nbytes: int):
    """(address, release) of ``nbytes`` of device memory in the stream order of ``s`` (grad's
    current stream), whose release never waits for the device (cudaFree would: a host wait per
    bucket): for a torch tensor, torch's caching allocator (the block returns to the current
    stream's pool when the tensor goes, and is reused by later work on that stream only: no driver
    call once warm); else stream-ordered memory (cudaMallocAsync / cudaFreeAsync)."""
    if hasattr(grad, "new_empty"):
        import torch
        t = torch.empty(nbytes, dtype=torch.uint8, device=grad.device)

        def release():
            nonlocal t
            t = None  # back to the caching allocator, in the current stream's order

        return t.data_ptr(), release
    ptr = dev.allocate_ordered(nbytes, s)
    return ptr, lambda: dev.free_ordered(ptr, s)
