"""The devices the "commlib" backend registers, and every torch helper that asks a process group
for its device, against gloo in the same processes (rank side: device_helper_cases.py, and
checkpoint_cases.py for the distributed checkpoints).

CPU build (CI): "cpu" only is registered; _get_pg_default_device, _get_object_coll_device, the
backend lookup, ShardedTensor's preferred device, DCP save/load with another sharding on load
(ShardedTensor and DTensor), the object collectives and DeviceMesh sub-meshes give what gloo gives,
at 2 and 3 ranks (the sub-meshes at 4 as well: a 2x2 mesh). GPU (``@pytest.mark.gpu``, skipped
without a CUDA device and a CUDA build of torch): "cuda" registered too, CPU tensors still on the
host path, a DTensor checkpoint on a CUDA mesh.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")

import checkpoint_cases  # noqa: E402
import device_helper_cases as cases  # noqa: E402
from commlib.testing import get_pool  # noqa: E402


def _case(name):
    """The rank-side function ``name``, in whichever cases module holds it."""
    return getattr(cases, name, None) or getattr(checkpoint_cases, name)


def _run(n, case, *args, timeout=120):
    fails = [f"rank {r}: {f}" for r, fs in enumerate(get_pool(n).run(case, *args, timeout=timeout))
             for f in fs]
    assert not fails, "\n".join(fails[:20])


def test_registered_devices_follow_the_cuda_path():
    import torch.distributed as dist

    import commlib.torch  # noqa: F401
    from commlib.torch.devices import cuda_served
    want = ["cpu", "cuda"] if cuda_served() else ["cpu"]
    assert dist.Backend.backend_capability["commlib"] == want
    if torch.version.cuda is None:  # a CPU build of torch cannot hold a CUDA tensor
        assert want == ["cpu"]


def test_cuda_served_needs_every_condition(monkeypatch):
    import importlib.util

    from commlib.torch import devices
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert devices.cuda_served() and devices.served_devices() == ["cpu", "cuda"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert not devices.cuda_served()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert not devices.cuda_served()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.version, "cuda", None)
    assert devices.served_devices() == ["cpu"]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", ["case_device_queries", "case_object_collectives",
                                  "case_dcp_sharded_tensor", "case_dcp_dtensor",
                                  "case_device_mesh_submeshes", "case_full_state_dict"])
def test_helpers_match_gloo(n, case):
    _run(n, _case(case))


def test_device_mesh_2x2_submeshes_match_gloo():
    _run(4, cases.case_device_mesh_submeshes)


@pytest.mark.parametrize("n", [2, 3])
def test_mixed_device_calls_are_refused(n):
    """meta stands in for a second device on a CPU build (the GPU test below uses cuda)."""
    _run(n, cases.case_mixed_devices, "meta")


needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="this torch build has no CUDA device")


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", ["case_cuda_registration", "case_cuda_dcp"])
def test_cuda_helpers(n, case):
    _run(n, _case(case), timeout=300)


@pytest.mark.gpu
@needs_torch_cuda
def test_cpu_and_cuda_tensors_in_one_call_are_refused():
    _run(2, cases.case_mixed_devices, "cuda", timeout=300)
