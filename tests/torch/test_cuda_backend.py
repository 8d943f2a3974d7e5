"""The "commlib" torch backend on CUDA tensors (rank side: torch_cuda_cases.py; tolerances there).

GPU tests (``@pytest.mark.gpu``: skipped without a CUDA device, and without a CUDA build of torch):
every rank on GPU 0 (several ranks per GPU), results against gloo on CPU copies in the same
processes; point-to-point against the values each message encodes (its layer below torch's
tensor type runs on the emulated device in test_cuda_p2p_emulated.py). CPU tests: what can be checked without a GPU (registration (test_torch_devices.py has the rest), which path a tensor takes,
the device check of commlib.parallel). Nothing here pretends a GPU ran.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")

from commlib.testing import get_pool  # noqa: E402

needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="this torch build has no CUDA device")


# -- CPU ----------------------------------------------------------------------------------------------
def test_backend_registered_for_cuda_only_where_served():
    import torch.distributed as dist

    import commlib.torch  # noqa: F401
    registered = dist.Backend.backend_capability["commlib"]
    assert registered[0] == "cpu"
    if not torch.cuda.is_available():  # no CUDA tensor here: torch's helpers must not pick "cuda"
        assert registered == ["cpu"]


def test_host_tensors_take_the_host_path():
    from commlib.torch.stream_work import cuda_device
    t = torch.ones(3)
    assert cuda_device([t]) is None
    assert cuda_device([[], [t, t]]) is None
    assert cuda_device([]) is None and cuda_device([[]]) is None
    if torch.cuda.is_available():
        c = torch.ones(2, device="cuda")
        assert cuda_device([[], [c]]) == c.device and cuda_device([c, t]) == c.device


def test_parallel_takes_one_device_and_names_the_odd_tensor():
    from commlib.parallel._buckets import check_one_device
    cpu = torch.ones(2)
    assert check_one_device([("a", cpu), ("b", cpu)]) == torch.device("cpu")
    with pytest.raises(ValueError, match="^parameter 'm': is on meta; commlib moves CPU and CUDA"):
        check_one_device([("a", cpu), ("m", torch.ones(2, device="meta"))])
    with pytest.raises(ValueError, match="^buffer 'b': is on cpu but the others are on meta"):
        check_one_device([("b", cpu)], "buffer", torch.device("meta"))


# -- GPU ----------------------------------------------------------------------------------------------
# Each case runs on every rank of a pool and returns its failures (torch_cuda_cases.py says what it
# compares and with which tolerance); 4 ranks on one GPU is the several-ranks-per-GPU path.
CUDA_CASES = [
    ("case_cuda_collectives", 2),      # every collective against gloo on CPU copies
    ("case_cuda_collectives", 3),
    ("case_cuda_cpp_steady", 2),       # repeated calls run from the C++ backend (device call cache)
    ("case_cuda_cpp_steady", 3),
    ("case_cuda_point_to_point", 2),   # send/recv/isend/irecv/batch_isend_irecv
    ("case_cuda_point_to_point", 3),
    ("case_cuda_ddp", 2),              # DDP on CUDA against gloo on CPU
    ("case_cuda_fsdp", 4),             # FSDP2, four ranks on one GPU
    ("case_cuda_parallel_wrappers", 2),  # commlib.parallel against CPU
]


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("case,n", CUDA_CASES, ids=[f"{c[len('case_cuda_'):]}-{n}" for c, n in CUDA_CASES])
def test_cuda_case(case, n):
    import torch_cuda_cases
    fails = [f for r in get_pool(n).run(getattr(torch_cuda_cases, case), timeout=300) for f in r]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("n", [2, 3])
def test_cuda_fresh_tensors_run_from_cpp(n):
    """Tensors made fresh every step (every call a new shape) run from the C++ backend after the
    first call on the stream (torch_cuda_new_shape_cases.py; emulated: test_cuda_new_shapes_emulated.py)."""
    import torch_cuda_new_shape_cases
    fails = [f for r in get_pool(n).run(torch_cuda_new_shape_cases.case_cuda_fresh_tensors_from_cpp, timeout=300)
             for f in r]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("n", [2, 3])
def test_cuda_staged_calls_equal_gloo(n):
    """Non-contiguous tensors, int16, bool and complex reductions on CUDA (the calls the backend
    stages) against gloo on CPU copies (torch_cuda_staged_cases.py; checked with device="cpu" here)."""
    import torch_cuda_staged_cases
    fails = [f for r in get_pool(n).run(torch_cuda_staged_cases.case_cuda_staged, timeout=300) for f in r]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.gpu
@needs_torch_cuda
def test_cuda_ddp_compressed_hook():
    """The DDP hook with int8 and error feedback on a CUDA model (stream engine, device error
    feedback) against the same hook on the CPU (torch_cuda_compress_cases.py)."""
    import torch_cuda_compress_cases
    fails = [f for r in get_pool(2).run(torch_cuda_compress_cases.case_cuda_ddp_compressed, timeout=300) for f in r]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.gpu
@needs_torch_cuda
def test_cuda_data_parallel_compressed():
    """commlib.parallel.DataParallel(compress="int8", error_feedback=True) on a CUDA model (stream
    engine, device error feedback) against the same on the CPU (torch_cuda_compress_cases.py)."""
    import torch_cuda_compress_cases
    fails = [f for r in get_pool(2).run(torch_cuda_compress_cases.case_cuda_data_parallel_compressed, timeout=300)
             for f in r]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.gpu
@needs_torch_cuda
def test_cuda_fsdp2_compressed():
    """FSDP2 with commlib's compressed all-gather and reduce-scatter on a CUDA mesh against the same
    on a CPU mesh (torch_cuda_compress_cases.py)."""
    import torch_cuda_compress_cases
    fails = [f for r in get_pool(2).run(torch_cuda_compress_cases.case_cuda_fsdp2_compressed, timeout=300) for f in r]
    assert not fails, "\n".join(fails[:20])
