"""Buffers and devices below the core API: what a user array is (host_buffers: NumPy, torch CPU,
or a device buffer), device buffers (buffers), the emulated device that runs the GPU
engine without a GPU (emulated, public as ``commlib.emulated``), libnccl's discovery (nccl, public
as ``commlib.nccl``) and the NCCL communicator of the stream engine (nccl_comm)."""
