"""The codecs' device kernels (csrc/kernels/codec_kernel.h: the CUDA launcher's bodies, run by the
emulated device through the thread-index shims) against the CPU codecs: the same encoded bytes and
the same decoded bits for every codec x dtype x block size x rounding, on awkward counts and data
(ties, subnormals, values near the dtype's largest, NaN/Inf blocks), with the encoded side at an
odd byte address (an all_gather's blocks of encoded bytes lie anywhere)."""
import numpy as np
import pytest

import commlib.emulated as emu
from codec_reference import as_dtype, awkward, codec_cases
from commlib.codecs import NAMES, Codec
from commlib.core import call_spec

COUNTS = (0, 1, 5, 37, 300)  # empty, one, under a block, prime, many blocks (int4: odd bytes)
BLOCKS = (1, 7, 32, 256)


class Emulated:
    """Device memory and a stream on emulated device 0."""

    def __init__(self):
        self.dev, self.stream = emu.device(), emu.Stream()._stream

    def put(self, data: bytes, extra: int, offset: int) -> tuple:
        base = self.dev.allocate(len(data) + extra + 16)
        self.dev.upload(base + offset, data, self.stream)
        return base, base + offset

    def get(self, ptr: int, nbytes: int) -> bytes:
        self.dev.synchronize_stream(self.stream)
        return self.dev.read(ptr, nbytes)

    def free(self, base: int):
        self.dev.free_async(base, self.stream)


class Cuda:
    """Device memory of GPU 0 (commlib._C_cuda's helpers) and its legacy default stream."""

    def __init__(self):
        import commlib._C as _C
        import commlib._C_cuda as cu
        self.cu = cu
        self.dev = _C.device_from_capsule(cu.device_capsule(0))
        self.stream = _C.stream_from_capsule(cu.stream_capsule(0, 0))

    def put(self, data: bytes, extra: int, offset: int) -> tuple:
        base = self.cu._malloc(len(data) + extra + 16)
        if data:
            self.cu._upload(base + offset, np.frombuffer(data, np.uint8))
        return base, base + offset

    def get(self, ptr: int, nbytes: int) -> bytes:
        self.dev.synchronize_stream(self.stream)
        out = np.empty(nbytes, np.uint8)
        if nbytes:
            self.cu._download(out, ptr)
        return out.tobytes()

    def free(self, base: int):
        self.cu._free(base)


def _device_encode(m, c, x, dtype, base):
    size = c.encoded_size(x.size)
    src_base, src = m.put(x.tobytes(), 0, 0)
    dst_base, dst = m.put(b"", size, 1)  # the encoded side at an odd address
    m.dev.codec_encode(dst, src, x.size, call_spec.dtype(dtype), c.name, c.block_size, c.rounding, c.seed, base,
                       m.stream)
    out = np.frombuffer(m.get(dst, size), np.uint8).copy()
    m.free(src_base), m.free(dst_base)
    return out


def _device_decode(m, c, data, count, like, dtype):
    src_base, src = m.put(data.tobytes(), 0, 3)
    dst_base, dst = m.put(b"", like.itemsize * count, 0)
    m.dev.codec_decode(dst, src, count, call_spec.dtype(dtype), c.name, c.block_size, m.stream)
    out = np.frombuffer(m.get(dst, like.itemsize * count), like.dtype).copy()
    m.free(src_base), m.free(dst_base)
    return out


def _match_cpu(m, codec):
    with np.errstate(over="ignore", invalid="ignore"):
        for dtype, c, count, what in codec_cases(codec, COUNTS, 11, BLOCKS):
            x = as_dtype(awkward(count, count + c.block_size), dtype)
            cpu, dev = c.encode(x, dtype, counter_base=5), _device_encode(m, c, x, dtype, 5)
            assert np.array_equal(cpu, dev), f"{what}: encode differs at bytes {np.nonzero(cpu != dev)[0][:5]}"
            junk = np.random.default_rng(count).integers(0, 256, cpu.size, dtype=np.uint8)
            for data in (cpu, junk):  # the encoder's bytes and arbitrary ones (every code)
                a, b = c.decode(data, count, dtype), _device_decode(m, c, data, count, x, dtype)
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{what}: decode differs"


@pytest.mark.parametrize("codec", NAMES)
def test_device_codecs_match_the_cpu_codecs_bitwise(codec):
    _match_cpu(Emulated(), codec)


@pytest.mark.gpu
@pytest.mark.parametrize("codec", NAMES)
def test_cuda_codecs_match_the_cpu_codecs_bitwise(codec):
    _match_cpu(Cuda(), codec)


def test_device_codecs_refuse_what_no_codec_codes():
    dev, s = emu.device(), emu.Stream()._stream
    p = dev.allocate(64)
    with pytest.raises(ValueError, match="dtype"):
        dev.codec_encode(p, p, 4, call_spec.dtype("int32"), "int8", 32, "nearest", 0, 0, s)
    with pytest.raises(ValueError, match="block_size"):
        dev.codec_decode(p, p, 4, call_spec.dtype("float32"), "int8", 0, s)
    with pytest.raises(ValueError, match="compress"):
        dev.codec_decode(p, p, 4, call_spec.dtype("float32"), "int3", 32, s)
    dev.free_async(p, s)


def _feedback_matches_cpu(to_device, to_host):
    """error_feedback_round on device buffers (core/device_feedback.py: the device's reduction and
    codec kernels) against the CPU's fused pass, bit for bit, with and without a residual."""
    from commlib.core.codecs import error_feedback_round
    from codec_reference import sample
    for codec in NAMES:
        for rounding in ("nearest", "stochastic"):
            c = Codec(codec, 7 if codec != "bf16" else 32, rounding, seed=3)
            for count in (1, 37, 300):
                grad = sample(count, count + 1)
                residual = (sample(count, count + 2) * np.float32(0.01)).astype(np.float32)
                for first in (True, False):
                    g, r = grad.copy(), residual.copy()
                    r = error_feedback_round(c, g, None if first else r)
                    dg = to_device(grad)
                    dr = error_feedback_round(c, dg, None if first else to_device(residual))
                    what = f"{codec} {rounding} n={count} first={first}"
                    assert np.array_equal(to_host(dg).view(np.uint32), g.view(np.uint32)), f"{what}: grad differs"
                    assert np.array_equal(to_host(dr).view(np.uint32), r.view(np.uint32)), f"{what}: residual differs"


def test_error_feedback_on_device_matches_the_cpu_pass():
    _feedback_matches_cpu(emu.from_numpy, lambda a: a.numpy())


def test_error_feedback_on_device_never_makes_the_host_wait():
    """Error feedback's temporary on emulated arrays is stream-ordered memory (cudaMallocAsync /
    cudaFreeAsync; a torch tensor's comes from torch's caching allocator): steady rounds make no
    cudaMalloc, no cudaFree (which waits for the whole device) and no synchronize."""
    from commlib.core.codecs import error_feedback_round
    c = Codec("int8", 32)
    g = emu.from_numpy(np.linspace(-1, 1, 1000, dtype=np.float32))
    r = emu.from_numpy(np.zeros(1000, np.float32))
    error_feedback_round(c, g, r)
    emu.current_stream().synchronize()
    dev = emu.device()
    before = dev.driver_calls()
    for _ in range(5):
        error_feedback_round(c, g, r)
    after = dev.driver_calls()
    calls = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    emu.current_stream().synchronize()
    waits = ("cudaMalloc", "cudaFree", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")
    assert not {k: v for k, v in calls.items() if k in waits}, calls
    assert calls.get("cudaMallocAsync") == calls.get("cudaFreeAsync") == 5, calls  # the count counts


@pytest.mark.gpu
def test_error_feedback_on_cuda_tensors_matches_the_cpu_pass():
    import torch
    _feedback_matches_cpu(lambda a: torch.from_numpy(a.copy()).cuda(), lambda t: t.cpu().numpy())
