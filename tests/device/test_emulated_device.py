"""The emulated device on its own (one process): its kernels are the CUDA kernel bodies and must
match the CPU kernels bit for bit; streams, events and arrays behave as CUDA's do."""
import os
import sys

import numpy as np
import pytest

import commlib.emulated as emu
import commlib._C as _C
from commlib.core.call_spec import DTYPE, OP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels"))
from kernel_reference import CASES, STORAGE, assert_bits_equal, random_data, seed  # noqa: E402

# Lengths x byte offsets: the kernel's three access paths (16-byte vectors, aligned elements,
# unaligned bytes), their tails, and a grid-stride loop (more packs than 8192 blocks x 256).
LENGTHS = [0, 1, 33, 4099]
BIG = 8192 * 256 * 4 + 5


def _upload(dev, stream, host, byte_offset):
    base = dev.allocate(host.nbytes + 64)
    dev.upload(base + byte_offset, host.tobytes(), stream)
    return base


def _download(dev, stream, ptr, like):
    dev.synchronize_stream(stream)
    return np.frombuffer(dev.read(ptr, like.nbytes), like.dtype).copy()


@pytest.mark.parametrize("dtype,op", CASES)
def test_kernels_match_cpu_kernels_bitwise(dtype, op):
    dev, s = emu.device(), emu.Stream()._stream
    rng = np.random.default_rng(seed("emulated", dtype, op))
    esize = _C.dtype_size(DTYPE[dtype])
    for n in LENGTHS + ([BIG] if (dtype, op) == ("float32", "sum") else []):
        for offset in ((0, esize, 1) if n < BIG else (0,)):
            a, b = random_data(dtype, n, rng), random_data(dtype, n, rng)
            want = a.copy()
            _C.reduce_local(want, b, DTYPE[dtype], OP[op])
            pa, pb = _upload(dev, s, a, offset), _upload(dev, s, b, offset)
            dev.reduce(pa + offset, pb + offset, n, DTYPE[dtype], OP[op], s)
            assert_bits_equal(_download(dev, s, pa + offset, a), want, f"{dtype} {op} n={n} offset={offset}")
            if op == "premul_sum":
                want = np.empty_like(a)
                _C.scale_copy(want, b, DTYPE[dtype], 0.75)
                dev.scale_copy(pa + offset, pb + offset, n, DTYPE[dtype], 0.75, s)
                assert_bits_equal(_download(dev, s, pa + offset, a), want, f"scale {dtype} n={n}")
            if op == "avg":
                want = a.copy()
                _C.divide_local(want, DTYPE[dtype], 3)
                dev.upload(pa + offset, a.tobytes(), s)
                dev.divide(pa + offset, n, DTYPE[dtype], 3, s)
                assert_bits_equal(_download(dev, s, pa + offset, a), want, f"divide {dtype} n={n}")
            dev.free_async(pa, s)
            dev.free_async(pb, s)


def test_bitwise_op_on_float_is_refused_when_enqueued():
    dev, s = emu.device(), emu.Stream()._stream
    p = dev.allocate(16)
    with pytest.raises(ValueError, match="op"):
        dev.reduce(p, p, 4, DTYPE["float32"], OP["band"], s)
    dev.free_async(p, s)


def test_arrays_round_trip_slices_and_copies():
    for dtype, st in STORAGE.items():
        host = (np.arange(10) * 3).astype(st)
        a = emu.from_numpy(host, dtype="bfloat16") if dtype == "bfloat16" else emu.from_numpy(host)
        assert a.dtype == dtype and len(a) == 10 and a.nbytes == host.nbytes
        assert np.array_equal(a.numpy(), host)
        b = emu.empty(4, dtype)
        b.copy_(a[3:7])
        assert np.array_equal(b.numpy(), host[3:7])
    with pytest.raises(ValueError, match="count"):
        emu.empty(-1)
    with pytest.raises(TypeError, match="dtype"):
        emu.empty(3, "complex64")
    with pytest.raises(ValueError, match="step"):
        emu.empty(8)[::2]


def test_stream_order_events_and_current_stream():
    """Work on one stream runs in order, after the call returned; an event recorded on it orders
    another stream; the current stream follows use_stream."""
    s1, s2 = emu.Stream(), emu.Stream()
    gate = emu.Event()
    src = emu.from_numpy(np.arange(1000, dtype=np.int64), stream=s1)
    dst = emu.empty(1000, "int64", stream=s1)
    dst.copy_(emu.from_numpy(np.zeros(1000, np.int64), stream=s1), stream=s1)
    dst.copy_(src, stream=s1)
    gate.record(s1)
    out = emu.empty(1000, "int64", stream=s2)
    s2.wait_event(gate)
    out.copy_(dst, stream=s2)
    with emu.use_stream(s2):
        assert emu.current_stream() is s2
        got = out.numpy()  # synchronises s2, which waited for s1's copies
    assert emu.current_stream() is emu.default_stream()
    assert gate.query()
    assert np.array_equal(got, np.arange(1000))
    emu.synchronize()


def test_memory_is_freed_in_stream_order():
    dev = emu.device()
    before = dev.allocated_bytes()
    arrays = [emu.from_numpy(np.ones(1 << 16, np.float32)) for _ in range(4)]
    assert dev.allocated_bytes() >= before + 4 * (1 << 18)
    del arrays
    emu.synchronize()
    assert dev.allocated_bytes() == before


@pytest.mark.parametrize("var,value", [("COMMLIB_EMULATED_DELAY_US", "soon"), ("COMMLIB_DEVICE_SLOT_BYTES", "100")])
def test_bad_settings_name_the_variable(var, value):
    """Read when the device (a process's first) or a stream engine is created: in a fresh
    interpreter, with one rank, through a real communicator."""
    import subprocess
    code = ("import commlib, commlib.emulated as emu, numpy as np\n"
            "from commlib.bootstrap.store import StoreServer, TCPStore\n"
            "s = StoreServer('127.0.0.1', 0)\n"
            "c = commlib.init(rank=0, world_size=1, store=TCPStore('127.0.0.1', s.port))\n"
            "try:\n    c.all_reduce(emu.from_numpy(np.ones(4, np.float32)))\n"
            "except ValueError as e:\n    print('ValueError', e)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, var: value},
                         capture_output=True, text=True, timeout=60)
    assert f"ValueError {var}" in out.stdout, out.stdout + out.stderr
