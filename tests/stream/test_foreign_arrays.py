"""Other libraries' device arrays through the C++ entry (issue #37, item 2): objects with
__cuda_array_interface__ (CuPy, Numba) and DLPack exporters on a CUDA device are read in C++ on
every call (csrc/bindings/foreign_arrays.cc), so a repeated collective on them is one C++ call from
Communicator like one on commlib's own arrays, every collective, blocking and async, on the current
stream or a named one; what no collective takes (layout, dtype, read-only memory, a copy, another
device) raises naming the argument, from the same reader, before anything is enqueued. On the
emulated device through views of emulated memory (foreign_arrays.py), in the rank pools of
test_device_collectives.py; on a GPU with CuPy and torch (@pytest.mark.gpu)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fast_device_call_cases import every_collective_misses  # noqa: E402
from foreign_array_cases import foreign_bad_arrays, foreign_every_collective_hits  # noqa: E402
from foreign_arrays import CudaArrayView, DLPackView  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402


@pytest.mark.parametrize("kind", ["cai", "dlpack", "dlpack0"])
def test_every_collective_on_foreign_arrays_hits_blocking_async_and_on_a_named_stream(pool, kind):
    k = 3
    for out in pool(2, env=DELAY_ENV).run(foreign_every_collective_hits, kind, k, timeout=60):
        assert len(out) == 8, out
        for name, (hits, works_ok, ok) in out.items():
            # As test_fast_device_call.py's: the first calls after the engine's set-up of the
            # collectives that run as one call are new shapes run from C++, on either stream.
            assert (hits, works_ok, ok) == (3 * k + 2 - every_collective_misses(name), True, True), (
                kind, name, out[name])


def test_foreign_arrays_no_collective_takes_raise_naming_the_argument(pool):
    for errors, ok in pool(2, env=DELAY_ENV).run(foreign_bad_arrays, timeout=60):
        assert ok, errors
        for label, hits, error, start in errors:
            assert hits == 0 and error and error.startswith(start), (label, hits, error, start)


def test_the_reader_sees_foreign_views_of_emulated_memory():
    import commlib._C as _C
    import commlib.emulated as emu
    from commlib.device.buffers import device_buffer
    x = emu.from_numpy(np.arange(6, dtype=np.int64), device_index=1)
    want = ("emulated", x.data_ptr(), 6, _C.DType.int64, 1, 0)
    assert _C.read_buffer(CudaArrayView(x)) == want  # the device from the pointer (emulated:1)
    assert _C.read_buffer(CudaArrayView(x, shape=(2, 3))) == want
    assert _C.read_buffer(CudaArrayView(x[2:4], shape=(2, 1), strides=(8, 99))) == (
        "emulated", x.data_ptr() + 16, 2, _C.DType.int64, 1, 0)  # a dimension of 1 has any stride
    for versioned in (True, False):
        v = DLPackView(x, versioned=versioned)
        assert _C.read_buffer(v) == want
        # The consumer's stream: the call's current CUDA stream, 0 (the legacy default) spelt 1.
        assert v.streams == [1], v.streams
    s = emu.Stream(1)
    with emu.use_stream(s):
        assert _C.read_buffer(CudaArrayView(x))[5] == _C.emulated_current_stream() != 0
    b = device_buffer(DLPackView(x), "x")
    assert (b.kind, b.ptr, b.count, b.dtype, b.device_index, b.stream) == ("emulated", x.data_ptr(), 6, "int64", 1, None)
    assert _C.read_buffer(CudaArrayView(x, readonly=True)) is None  # unreadable: the Python path explains
    assert device_buffer(np.zeros(2)) is None and _C.read_device_array(np.zeros(2), "x") is None  # DLPack on the CPU
    assert _C.read_device_array([1, 2], "x") is None
