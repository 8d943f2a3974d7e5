"""CUDA buffers: recognition (__cuda_array_interface__, DLPack, torch) and the route to the CUDA
device runs everywhere; the @pytest.mark.gpu tests need a GPU and skip cleanly without one."""
import numpy as np
import pytest

import commlib
from commlib.device.buffers import _from_dlpack, device_buffer


class FakeCudaArray:
    """Anything exposing __cuda_array_interface__ (as CuPy and Numba arrays do)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000001000, stream=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream


def test_cuda_array_interface_is_recognised_and_checked():
    b = device_buffer(FakeCudaArray((4, 5)))
    assert (b.kind, b.ptr, b.count, b.dtype) == ("cuda", 0x7F0000001000, 20, "float32")
    assert device_buffer(FakeCudaArray((3,), "<i8")).dtype == "int64"
    with pytest.raises(ValueError, match="x: CUDA array must be C-contiguous"):
        device_buffer(FakeCudaArray((4, 5), strides=(4, 16)), "x")
    with pytest.raises(TypeError, match="x: unsupported CUDA array typestr"):
        device_buffer(FakeCudaArray((4,), "<c8"), "x")
    assert device_buffer(np.zeros(3)) is None and device_buffer(None) is None


def test_cuda_array_interface_takes_the_pointers_device_and_stream(monkeypatch):
    """Issue #23 item 5: the device comes from the pointer's attributes (not always 0), and the
    interface's stream is the call's stream, never torch's current one (a CPU-only torch raises
    there)."""
    import sys
    import types

    import commlib.device.buffers as dbuf
    import commlib.core.device_route as de
    monkeypatch.setattr(dbuf, "_pointer_device", lambda ptr: 3 if ptr == 0x7F0000001000 else 0)
    b = device_buffer(FakeCudaArray((4,), stream=0x5150))
    assert (b.device_index, b.stream) == (3, 0x5150)
    assert device_buffer(FakeCudaArray((4,))).stream == 0  # no stream key: the legacy default stream

    def no_torch_stream(index):
        raise AssertionError("a CUDA array interface buffer went through torch's current stream")
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=no_torch_stream))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    fake_cuda = types.SimpleNamespace(stream_capsule=lambda index, ptr: ("capsule", index, ptr))
    monkeypatch.setattr(de, "_cuda_module", lambda name: fake_cuda)
    monkeypatch.setattr(de._C, "stream_from_capsule", lambda capsule: capsule)
    assert de.stream_resolver(b)(None) == ("capsule", 3, 0x5150)


def test_dlpack_tensors_are_parsed():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    b = _from_dlpack(t, "t")
    assert (b.ptr, b.count, b.dtype) == (t.data_ptr(), 12, "bfloat16")
    with pytest.raises(ValueError, match="t: CUDA array must be contiguous"):
        _from_dlpack(t.t(), "t")


def test_cuda_buffers_without_a_usable_cuda_module_are_refused_clearly(pool):
    try:
        import commlib._C_cuda  # noqa: F401
        pytest.skip("a GPU is present: the CUDA route is taken")
    except ImportError:
        pass
    assert pool(1).run(_all_reduce_fake_cuda) == ["commlib._C_cuda is not usable here"]


def _all_reduce_fake_cuda(comm):
    try:
        comm.all_reduce(FakeCudaArray((8,)))
    except RuntimeError as e:
        return "commlib._C_cuda is not usable here" if "_C_cuda is not usable here" in str(e) else str(e)
    return "no error"


# -- on a GPU ------------------------------------------------------------------------------------

def _torch_cuda_all_reduce(comm, algorithm):
    import torch
    torch.cuda.set_device(0)  # every rank on GPU 0: several ranks per GPU, which NCCL refuses
    x = torch.full((1 << 20,), float(comm.rank + 1), device="cuda")
    comm.all_reduce(x, algorithm=algorithm)  # enqueued on torch's current stream
    want = comm.size * (comm.size + 1) / 2
    return bool((x == want).all().item())  # .item() waits for the stream


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "direct"])
def test_torch_cuda_all_reduce_several_ranks_per_gpu(pool, algorithm):
    assert pool(4).run(_torch_cuda_all_reduce, algorithm) == [True] * 4


def _cupy_all_gather(comm):
    import cupy
    y = cupy.full(1000, comm.rank, cupy.float16)
    out = cupy.empty(1000 * comm.size, cupy.float16)
    comm.all_gather(out, y)
    return bool((out.get() == np.repeat(np.arange(comm.size), 1000).astype(np.float16)).all())


@pytest.mark.gpu
def test_cupy_all_gather(pool):
    pytest.importorskip("cupy")
    assert pool(2).run(_cupy_all_gather) == [True, True]

