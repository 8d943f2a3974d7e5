"""The "commlib" torch backend on CUDA tensors (rank side: torch_cuda_cases.py; tolerances there).

GPU tests (``@pytest.mark.gpu``: skipped without a CUDA device, and without a CUDA build of torch):
every rank on GPU 0 (several ranks per GPU), results against gloo on CPU copies in the same
processes; point-to-point against the values each message encodes (its layer below torch's
tensor type runs on the emulated device in test_cuda_p2p_emulated.py). CPU tests: what can be checked without a GPU (registration, which path a tensor takes,
the device check of commlib.parallel). Nothing here pretends a GPU ran.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")

from ranks import get_pool  # noqa: E402

needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="this torch build has no CUDA device")


# -- CPU ----------------------------------------------------------------------------------------------
def test_backend_registered_for_cpu_and_cuda():
    import torch.distributed as dist

    import commlib.torch  # noqa: F401
    assert dist.Backend.backend_capability["commlib"] == ["cpu", "cuda"]


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
@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("n", [2, 3])
def test_cuda_collectives_match_gloo(n):
    import torch_cuda_cases
    fails = [f for r in get_pool(n).run(torch_cuda_cases.case_cuda_collectives, timeout=300) for f in r]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("n", [2, 3])
def test_cuda_point_to_point(n):
    import torch_cuda_cases
    fails = [f for r in get_pool(n).run(torch_cuda_cases.case_cuda_point_to_point, timeout=300) for f in r]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.gpu
@needs_torch_cuda
def test_cuda_ddp_matches_gloo_on_cpu():
    import torch_cuda_cases
    fails = [f for r in get_pool(2).run(torch_cuda_cases.case_cuda_ddp, timeout=300) for f in r]
    assert not fails, "\n".join(fails)


@pytest.mark.gpu
@needs_torch_cuda
def test_cuda_fsdp2_four_ranks_on_one_gpu():
    import torch_cuda_cases
    fails = [f for r in get_pool(4).run(torch_cuda_cases.case_cuda_fsdp, timeout=300) for f in r]
    assert not fails, "\n".join(fails)


@pytest.mark.gpu
@needs_torch_cuda
def test_cuda_parallel_wrappers_match_cpu():
    import torch_cuda_cases
    fails = [f for r in get_pool(2).run(torch_cuda_cases.case_cuda_parallel_wrappers, timeout=300) for f in r]
    assert not fails, "\n".join(fails)
