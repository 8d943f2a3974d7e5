"""The C++ c10d::Backend of "commlib" (commlib._C_torch, csrc/torch_backend/): torch's dispatcher
sees its eager collectives as it sees gloo's, and a module built against another torch is refused.
The behaviour of every call is tested by the rest of tests/torch, which runs on this backend."""
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")

import dispatch_cases  # noqa: E402
import process_group_cases  # noqa: E402
from commlib.testing import get_pool  # noqa: E402
from commlib.torch import native  # noqa: E402

COUNTED = ("all_reduce", "broadcast", "scatter", "all_gather_into_tensor", "reduce_scatter_tensor",
           "all_to_all_single")


@pytest.mark.parametrize("n", [2, 3])
def test_dispatch_modes_count_commlib_as_gloo(n):
    for rank, (gloo, ours) in enumerate(get_pool(n).run(dispatch_cases.case_dispatch_counts)):
        assert ours == gloo, f"rank {rank}: commlib {ours} != gloo {gloo}"
        debug, ops = gloo
        assert sum(debug.values()) == len(COUNTED), debug  # one of each, as counted for gloo
        assert ops.get("send") == (1 if rank == 0 else None) and ops.get("recv_") == (1 if rank == 1 else None), ops


@pytest.mark.parametrize("n", [2, 3])
def test_a_commlib_group_is_torchs_process_group_named_commlib(n):
    """torch takes the creator's ProcessGroup as the group: torch's own class in Python (so its
    `type(group) is ProcessGroup` gates hold), the C++ backend registered for the served devices,
    torch's names, and getBackendName() "commlib", which DDP's logger records. A mixed backend
    string keeps torch's group (its other backend would be lost), named as torch names it."""
    for rank, seen in enumerate(get_pool(n).run(process_group_cases.case_process_group, timeout=120)):
        for k in ("world", "new_group", "cpu:commlib"):
            g = seen[k]
            assert g["type"] == "ProcessGroup" and g["name"] == g["backend_name"] == "commlib", (k, g)
            assert g["rank"] == rank and g["size"] == n and g["cpu_backend_is_cpp"], (k, g)
            assert g["group_name"] == g["registered_name"] and g["bound_device"] is None, (k, g)
            assert set(g["backends"].values()) == {"CommlibBackend"}, (k, g)
        assert seen["world"]["group_desc"] == "default_pg" and seen["new_group"]["group_desc"] == "a commlib group"
        assert seen["cpu:commlib"]["devices"] == ["cpu"]
        assert seen["world"]["devices"] == [str(torch.device(d)) for d in native_devices()]
        mixed = seen["mixed"]
        assert mixed["backends"] == {"cpu": "CommlibBackend", "cuda": "ProcessGroupGloo"}, mixed
        assert mixed["backend_name"] != "commlib" and mixed["group_desc"] == "mixed", mixed
        assert seen["ddp_backend_name"] == "commlib", seen["ddp_backend_name"]


def native_devices():
    from commlib.torch import devices
    return devices.served_devices()


def test_the_backend_is_the_cpp_one():
    module = native.load()
    assert module is not None, "commlib._C_torch was not built (scripts/setup.sh builds it)"
    assert module.built_torch_version == torch.__version__ == native.recorded_torch_version()


def test_a_module_built_for_another_torch_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "_C_torch.torch_version"
    fake.write_text("2.12.0+cpu\n")
    monkeypatch.setattr(native, "VERSION_FILE", fake)
    monkeypatch.setattr(native, "_module", None)
    want = (r"commlib\._C_torch was built against torch 2\.12\.0\+cpu, but torch "
            + re.escape(torch.__version__) + " is installed")
    with pytest.raises(ImportError, match=want):
        native.load()


def test_debug_detail_wraps_the_group_and_catches_a_mismatch():
    for wrapper, message in get_pool(2).run(dispatch_cases.case_detail_wrapper, timeout=120):
        assert wrapper == "_ProcessGroupWrapper", wrapper
        assert "mismatch" in message.lower(), message


def test_torchs_group_helper_still_holds_what_the_creator_reads():
    """torch hands a creator neither the backend string's device map nor the bound device
    (docs/torch_backend.md, "Registered"): native.py reads both from the frame of torch's private
    _new_process_group_helper. A torch that renames them must fail here, not hand users torch's
    "custom" group with a warning."""
    problems = native.frame_contract_problems()
    assert problems == [], (f"torch {torch.__version__}: {problems}; commlib.torch.native's frame read "
                            "(process_group) needs updating for this torch")


def test_the_frame_read_takes_the_helpers_locals_and_warns_once_without_them(monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(native, "_warned", False)

    def _new_process_group_helper(backend_config, device_id=None):  # torch's names
        return native._group_being_created(_new_process_group_helper)

    devices, bound, only_commlib = _new_process_group_helper(dist.BackendConfig("cpu:commlib"))
    assert devices == [torch.device("cpu")] and bound is None and only_commlib
    assert _new_process_group_helper(dist.BackendConfig("cpu:commlib,cuda:gloo"))[2] is False

    def renamed(backend_cfg, device_id=None):  # a torch that renamed backend_config
        return native._group_being_created(renamed)

    assert native.frame_contract_problems(renamed) == ["renamed has no local 'backend_config'"]
    with pytest.warns(RuntimeWarning, match=r"has no backend_config.*named 'custom'"):
        assert renamed(dist.BackendConfig("cpu:commlib")) is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert renamed(dist.BackendConfig("cpu:commlib")) is None  # once only
