"""CUDA reduction kernels (commlib._C_cuda) against the CPU kernels and the NumPy reference.

The @gpu tests are skipped (by tests/conftest.py) wherever `import commlib._C_cuda` fails. They
need neither torch nor CuPy: device memory comes from the module's _malloc/_upload/_download.
The unmarked test checks the failure mode itself: built module + no GPU = a clear ImportError.
"""
import glob
import os
import subprocess
import sys

import numpy as np
import pytest

import commlib._C as _C
from kernel_reference import (BITWISE_OPS, CASES, DTYPES, FLOATS, LENGTHS, assert_bits_equal, random_data,
                              reference_divide, reference_reduce, reference_scale, seed)
from commlib.core.call_spec import DTYPE, OP

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cuda():
    import commlib._C_cuda as cu
    return cu


class DeviceBuffer:
    """Device memory holding a copy of a host array at a chosen byte offset from a 256-byte
    aligned allocation."""

    def __init__(self, host, byte_offset=0):
        self.cu = cuda()
        self.dtype, self.n = host.dtype, host.size
        self.base = self.cu._malloc(host.nbytes + 512)
        self.ptr = self.base + byte_offset
        self.cu._upload(self.ptr, np.ascontiguousarray(host))

    def get(self):
        out = np.empty(self.n, self.dtype)
        self.cu._download(out, self.ptr)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cu._free(self.base)


def cpu_reduce(a, b, dtype, op):
    out = a.copy()
    _C.reduce_local(out, b, DTYPE[dtype], OP[op])
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype,op", CASES)
def test_gpu_reduce_matches_cpu(dtype, op, n):
    rng = np.random.default_rng(seed("gpu", dtype, op, n))
    a, b = random_data(dtype, n, rng), random_data(dtype, n, rng)
    want = cpu_reduce(a, b, dtype, op)
    assert_bits_equal(want, reference_reduce(a, b, dtype, op), "cpu vs reference")
    with DeviceBuffer(a) as d, DeviceBuffer(b) as s:
        cuda().reduce(d.ptr, s.ptr, n, dtype, op)
        assert_bits_equal(d.get(), want, f"gpu {dtype} {op} n={n}")
        assert_bits_equal(s.get(), b, "src must be untouched")


@pytest.mark.gpu
def test_gpu_float16_every_pattern_matches_cpu():
    """On the GPU float16 converts with the cvt instructions (kernels/float_bits.h), on the CPU with
    integer code: every binary16 pattern against -0.0 (each value loaded and stored back: NaN
    payloads, subnormals, both zeros) and against three permutations of every pattern (sums and
    products that round at every boundary, ties, overflow and subnormal results), bit for bit."""
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    rng = np.random.default_rng(seed("gpu-f16-every"))
    others = [np.full(every.size, -0.0, np.float16)] + [rng.permutation(every) for _ in range(3)]
    for op in ("sum", "prod", "min", "max"):
        for b in others:
            with DeviceBuffer(every) as d, DeviceBuffer(b) as s:
                cuda().reduce(d.ptr, s.ptr, every.size, "float16", op)
                assert_bits_equal(d.get(), cpu_reduce(every, b, "float16", op), f"gpu float16 {op} every pattern")


@pytest.mark.gpu
@pytest.mark.parametrize("dst_off,src_off", [(16, 48), (1, 0), (0, 3), ("elem", "elem"), ("elem", 16)])
@pytest.mark.parametrize("dtype,op", [(d, o) for d in DTYPES for o in ("sum", "min", "prod")])
def test_gpu_reduce_unaligned(dtype, op, dst_off, src_off):
    n = 4099
    rng = np.random.default_rng(seed("gpu-unaligned", dtype, op))
    a, b = random_data(dtype, n, rng), random_data(dtype, n, rng)
    size = a.itemsize
    with DeviceBuffer(a, size if dst_off == "elem" else dst_off) as d, \
            DeviceBuffer(b, size if src_off == "elem" else src_off) as s:
        cuda().reduce(d.ptr, s.ptr, n, dtype, op)
        assert_bits_equal(d.get(), cpu_reduce(a, b, dtype, op), f"gpu {dtype} {op} offsets {dst_off},{src_off}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,op", CASES)
def test_gpu_reduce_in_place(dtype, op):
    a = random_data(dtype, 10007, np.random.default_rng(3))
    with DeviceBuffer(a) as d:
        cuda().reduce(d.ptr, d.ptr, a.size, dtype, op)
        assert_bits_equal(d.get(), cpu_reduce(a, a, dtype, op), f"gpu {dtype} {op} in place")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 33, 100003])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_scale_copy_and_divide(dtype, n):
    a = random_data(dtype, n, np.random.default_rng(seed("gpu-scale", dtype, n)))
    for scale in (0.5, -1.25, 1e-3, 1e30):
        want = np.zeros_like(a)
        _C.scale_copy(want, a, DTYPE[dtype], scale)
        assert_bits_equal(want, reference_scale(a, dtype, scale), "cpu vs reference")
        with DeviceBuffer(np.zeros_like(a), 1 if n % 2 else 0) as d, DeviceBuffer(a) as s:
            cuda().scale_copy(d.ptr, s.ptr, n, dtype, scale)
            assert_bits_equal(d.get(), want, f"gpu {dtype} x {scale}")
    for divisor in (1, 3, 8, 1000, 2**40):
        want = a.copy()
        _C.divide_local(want, DTYPE[dtype], divisor)
        assert_bits_equal(want, reference_divide(a, dtype, divisor), "cpu vs reference")
        with DeviceBuffer(a) as d:
            cuda().divide(d.ptr, n, dtype, divisor)
            assert_bits_equal(d.get(), want, f"gpu {dtype} / {divisor}")


@pytest.mark.gpu
def test_gpu_errors():
    cu = cuda()
    assert cu.device_count() >= 1
    a = np.zeros(8, np.float32)
    with DeviceBuffer(a) as d:
        for dtype in FLOATS:
            for op in BITWISE_OPS:
                with pytest.raises(ValueError, match="op"):
                    cu.reduce(d.ptr, d.ptr, 8, dtype, op)
        with pytest.raises(ValueError, match="dtype"):
            cu.reduce(d.ptr, d.ptr, 8, "complex64", "sum")
        with pytest.raises(ValueError, match="divisor"):
            cu.divide(d.ptr, 8, "float32", 0)
    with pytest.raises(ValueError, match="dst_ptr"):
        cu.reduce(a.ctypes.data, a.ctypes.data, 8, "float32", "sum")


def test_import_without_gpu_is_a_clear_error():
    """Where _C_cuda was built but no GPU (or driver) exists, importing it raises ImportError
    naming the cause: never a crash, never an unresolved-symbol error."""
    built = glob.glob(os.path.join(ROOT, "commlib", "_C_cuda*.so"))
    if not built:
        pytest.skip("commlib._C_cuda was not built (no nvcc)")
    # Load the extension file itself (not through commlib/__init__.py), in a fresh process so that
    # a crash fails this test instead of killing pytest.
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('commlib._C_cuda', sys.argv[1])\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(module)\n")
    proc = subprocess.run([sys.executable, "-c", code, built[0]], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode == 0:
        pytest.skip("a CUDA device is present")
    assert proc.returncode == 1, f"import crashed (rc={proc.returncode}): {proc.stderr[-2000:]}"
    assert "ImportError" in proc.stderr and "no CUDA device" in proc.stderr, proc.stderr[-2000:]
