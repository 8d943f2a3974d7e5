"""The symmetric pool's CUDA arrays (commlib/device/cuda_array.py) without a GPU: what they tell
torch and CuPy. DLPack's export (csrc/bindings/dlpack_export.cc) is read back by NumPy and torch
over host memory (the same capsule with the CPU's device type: shape, dtype, address, the owner
kept alive while the consumer's array lives and released after), and a CudaArray's two protocols
by commlib's own reader of foreign arrays (csrc/bindings/foreign_arrays.cc), bfloat16 through
DLPack only. The GPU form is test_symmetric_cuda.py."""
import gc
import sys

import numpy as np
import pytest

import commlib._C as _C
from commlib.device import dtypes
from commlib.device.cuda_array import CudaArray

_CODE = {name: code_bits for code_bits, name in dtypes.DLPACK.items()}


class _HostExport:
    """Host memory exported through dlpack_export with the CPU's device type (1)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        code, bits = _CODE[str(self.array.dtype)]
        return _C.dlpack_export(self, self.array.ctypes.data, list(self.array.shape), code, bits, 1, 0)

    def __dlpack_device__(self):
        return (1, 0)


class _Block:
    ptr = 0x7f0000100000  # no memory behind it: only the descriptions are read


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_dlpack_export_is_read_back_by_numpy_and_torch(dtype):
    host = np.arange(24).astype(dtype).reshape(2, 3, 4)
    exporter = _HostExport(host)
    refs = sys.getrefcount(exporter)
    view = np.from_dlpack(exporter)
    assert view.shape == host.shape and view.dtype == host.dtype
    assert view.ctypes.data == host.ctypes.data and (view == host).all()
    assert sys.getrefcount(exporter) == refs + 1  # the consumer's array holds the owner
    del view
    gc.collect()
    assert sys.getrefcount(exporter) == refs  # and lets it go with the array
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(exporter)
    assert t.data_ptr() == host.ctypes.data and t.shape == host.shape
    _C.dlpack_export(exporter, host.ctypes.data, [24], *_CODE[dtype], 1, 0)  # never consumed: released
    gc.collect()
    assert sys.getrefcount(exporter) == refs + 1  # only t's


@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16"])
def test_a_cuda_array_describes_itself_to_both_protocols(dtype):
    a = CudaArray(_Block(), 0, (3, 5), dtype)
    assert a.__dlpack_device__() == (2, 0) and a.nbytes == 15 * dtypes.SIZE[dtype]
    if dtype == "bfloat16":
        assert not hasattr(a, "__cuda_array_interface__")  # no typestr spells it: DLPack only
    else:
        cai = a.__cuda_array_interface__
        assert (cai["shape"], cai["data"], cai["version"]) == ((3, 5), (_Block.ptr, False), 3)
        assert dtypes.TYPESTR[cai["typestr"]] == dtype
    # commlib's reader of other libraries' arrays: a CUDA array of 15 elements on device 0
    kind, ptr, count, dt, index, _ = _C.read_device_array(a, "a")
    assert (kind, ptr, count, dt.name, index) == ("cuda", _Block.ptr, 15, dtype, 0)
    with pytest.raises(BufferError, match="copy"):
        a.__dlpack__(copy=True)
