"""Buffers and devices below the core API: what a user array is (host_buffers: NumPy, torch CPU,
or a device buffer), device buffers (buffers), the emulated device that runs the GPU
engine without a GPU (emulated, public as ``commlib.emulated``), libnccl's discovery (nccl, public
as ``commlib.nccl``) and the NCCL communicator of the stream engine (nccl_comm)."""


def empty(shape, dtype: str = "float32", comm=None, device=None):
    """An array of ``shape`` from ``comm``'s symmetric pool on ``device`` (commlib/device/symmetric.py):
    at the same offset on every rank, mapped on every peer by the kernel path's registry; on CUDA a
    commlib.device.cuda_array.CudaArray (torch and CuPy take it without a copy). Collective."""
    from commlib.device.symmetric import empty as _empty
    return _empty(shape, dtype, comm=comm, device=device)
