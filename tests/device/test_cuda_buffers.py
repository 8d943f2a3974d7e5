"""CUDA buffers: recognition (__cuda_array_interface__, DLPack, torch) and the route to the CUDA
device runs everywhere; the @pytest.mark.gpu tests need a GPU and skip cleanly without one."""
import numpy as np
import pytest

import commlib
from commlib.device.buffers import device_buffer


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


def test_cuda_array_interface_takes_the_interfaces_stream(monkeypatch):
    """Issue #23 item 5: the interface's stream is the call's stream, never torch's current one (a
    CPU-only torch raises there). (The device comes from the pointer: test_foreign_arrays.py, on
    emulated memory of device 1.)"""
    import sys
    import types

    import commlib.core.device_route as de
    b = device_buffer(FakeCudaArray((4,), stream=0x5150))
    assert (b.device_index, b.stream) == (0, 0x5150)  # no usable commlib._C_cuda here: device 0
    assert device_buffer(FakeCudaArray((4,))).stream is None  # no stream key: no stream of its own

    def no_torch_stream(index):
        raise AssertionError("a CUDA array interface buffer went through torch's current stream")
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=no_torch_stream))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    fake_cuda = types.SimpleNamespace(stream_capsule=lambda index, ptr: ("capsule", index, ptr))
    monkeypatch.setattr(de, "_cuda_module", lambda name: fake_cuda)
    monkeypatch.setattr(de._C, "stream_from_capsule", lambda capsule: capsule)
    assert de.stream_resolver(b)(None) == ("capsule", 0, 0x5150)


def test_a_cuda_array_interface_naming_no_stream_runs_on_the_current_stream(monkeypatch):
    """CAI v3: with no "stream" key (or None) no synchronization is needed, so the call runs where
    any buffer that is not torch's does (docs/gpu.md): the current stream as the registered reader
    gives it, on the Python route and in the C++ entry's reader alike; not the legacy default 0."""
    import types

    import commlib._C as _C
    import commlib.core.device_route as de
    for cai in (FakeCudaArray((4,)), FakeCudaArray((4,), stream=None)):
        b = device_buffer(cai)
        assert b.stream is None, b
        monkeypatch.setattr(de, "_cuda_module", lambda name: types.SimpleNamespace(
            stream_capsule=lambda index, ptr: ("capsule", index, ptr)))
        monkeypatch.setattr(de._C, "stream_from_capsule", lambda capsule: capsule)
        monkeypatch.setattr(de, "_current_cuda_stream", lambda index: 0x7170)
        assert de.stream_resolver(b)(None) == ("capsule", 0, 0x7170)
    if _C.cuda_stream_reader() != "":  # (a reader registered in this process: it answers first)
        return
    # The entry's reader: the current stream another library's reader gives (CuPy's, here a fake),
    # where an interface naming 0x5150 keeps its own.
    _C.register_cuda_stream_reader(lambda index: types.SimpleNamespace(ptr=0x7170), "ptr")
    try:
        assert _C.read_buffer(FakeCudaArray((4,)))[5] == 0x7170
        assert _C.read_buffer(FakeCudaArray((4,), stream=None))[5] == 0x7170
        assert _C.read_buffer(FakeCudaArray((4,), stream=0x5150))[5] == 0x5150
    finally:
        _C.register_cuda_stream_reader(None)
    assert _C.cuda_stream_reader() == "" and _C.read_buffer(FakeCudaArray((4,)))[5] == 0  # (none: the legacy default)


class _OnCuda:
    """A DLPack exporter claiming CUDA device 0 for a CPU torch tensor's memory (its capsule)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (2, 0)


def test_dlpack_tensors_are_parsed():
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    b = device_buffer(_OnCuda(t), "t")
    assert (b.kind, b.ptr, b.count, b.dtype, b.device_index) == ("cuda", t.data_ptr(), 12, "bfloat16", 0)
    with pytest.raises(ValueError, match="t: DLPack array must be C-contiguous"):
        device_buffer(_OnCuda(t.t()), "t")
    assert device_buffer(torch.zeros(2).numpy()) is None  # DLPack on the CPU: a host buffer


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



def _foreign_cuda_hits(comm):
    """Views of a torch CUDA tensor as another library's array (__cuda_array_interface__, DLPack)
    through the C++ entry: (hits of 4 calls each, commlib's heap allocations in them, results right)."""
    import torch

    import commlib._C as _C
    torch.cuda.set_device(0)
    x = torch.ones(1024, device="cuda")

    class Interface:
        @property
        def __cuda_array_interface__(self):
            return x.__cuda_array_interface__

    class DLPack:
        def __dlpack__(self, **kw):
            return x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return x.__dlpack_device__()
    out = []
    for view in (Interface(), DLPack()):
        for _ in range(2):
            comm.all_reduce(view, op="max")
        hits, allocs = _C.device_fast_path_counts()[1], _C.thread_allocations()
        for _ in range(4):
            comm.all_reduce(view, op="max")
        out.append((_C.device_fast_path_counts()[1] - hits, _C.thread_allocations() - allocs))
    torch.cuda.synchronize()
    return out, bool((x == 1).all().item())


@pytest.mark.gpu
def test_foreign_cuda_arrays_hit_the_cpp_entry(pool):
    """NEVER RUN (no GPU lent while it was written): __cuda_array_interface__ and DLPack views of
    CUDA memory are read in C++ and hit the entry, with no allocation per blocking call."""
    pytest.importorskip("torch")
    for out, right in pool(2).run(_foreign_cuda_hits, timeout=120):
        assert right and out == [(4, 0), (4, 0)], out


def _cupy_hits(comm):
    import cupy

    import commlib._C as _C
    y = cupy.full(1000, comm.rank, cupy.float32)
    comm.all_reduce(y, op="max")
    hits = _C.device_fast_path_counts()[1]
    for _ in range(3):
        comm.all_reduce(y, op="max")
    return _C.device_fast_path_counts()[1] - hits, bool((y.get() == comm.size - 1).all())


@pytest.mark.gpu
def test_cupy_arrays_hit_the_cpp_entry(pool):
    """NEVER RUN: CuPy arrays (on CuPy's current stream) through the C++ entry."""
    pytest.importorskip("cupy")
    assert pool(2).run(_cupy_hits, timeout=120) == [(3, True), (3, True)]
