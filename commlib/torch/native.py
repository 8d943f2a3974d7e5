"""The C++ ``c10d::Backend`` of the "commlib" backend (``commlib._C_torch``, csrc/torch_backend/).

setup.py builds it against the installed torch and records that torch's version beside it
(``commlib/_C_torch.torch_version``). A C++ extension is tied to the torch it was compiled
against (its C++ ABI, its classes' layouts), so a module built for another torch is refused here,
before it is loaded, with both versions named, rather than left to crash or fail on a missing
symbol. Without the module (``COMMLIB_NO_TORCH_BACKEND=1`` at build time, or torch installed after
the build) groups are the Python backend alone (``backend.ProcessGroupCommlib``).
"""
from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from commlib.bootstrap.secret import SignedStore

VERSION_FILE = Path(__file__).resolve().parent.parent / "_C_torch.torch_version"


def recorded_torch_version() -> Optional[str]:
    """The torch version commlib._C_torch was built against; None when it was not built."""
    try:
        return VERSION_FILE.read_text().strip()
    except FileNotFoundError:
        return None


def check_torch_version(built: str, running: str) -> None:
    """Refuse a module built against another torch than the one running (ImportError)."""
    if built != running:
        raise ImportError(f"commlib._C_torch was built against torch {built}, but torch {running} is installed: "
                          "rebuild commlib against this torch (scripts/setup.sh) or install torch " + built)


_module = None


def load():
    """``commlib._C_torch`` (loaded once), or None where it was not built."""
    global _module
    if _module is not None:
        return _module
    built = recorded_torch_version()
    if built is None or importlib.util.find_spec("commlib._C_torch") is None:
        return None
    check_torch_version(built, torch.__version__)
    import commlib._C_torch as module
    check_torch_version(module.built_torch_version, torch.__version__)  # the module's own word
    _module = module
    return module


def wrap(group):
    """The C++ backend of the Python backend ``group`` (ProcessGroupCommlib), or ``group`` itself
    where there is no C++ backend or no core to call (a stand-in communicator in tests)."""
    module = load()
    core = getattr(group, "_core_address", None)
    if module is None or core is None:
        return group
    # group._algo is keyed in backend.COLLECTIVES's order, which is the core's Collective order
    algorithms = list(group._algo.values())
    _device_route_now(group)
    return module.CommlibBackend(group, core, group.rank(), group.size(), algorithms, wrap)


def _device_route_now(group):
    """Makes the communicator's device route now, so that the C++ backend's first call on a CUDA
    device (or emulated memory through its test seam) finds the route's call cache and sets the
    device's engine up from C++ (csrc/bindings/device_engines.h), never through the route; over
    the group's c10d::Store itself where the communicator has torch's store, or a SignedStore over
    it (``COMMLIB_SECRET``: the route signs and verifies in C++ with the SignedStore's key)."""
    route_of = getattr(getattr(group, "_comm", None), "_device", None)
    if not callable(route_of):
        return
    route = route_of()
    if torch.cuda.is_available():
        route.enable_cpp_cuda_setup()
    store = getattr(group._comm, "_store", None)
    if type(store) is SignedStore:  # (exactly: a subclass may sign otherwise, so it keeps its object)
        store = store.inner
    if isinstance(store, dist.Store):  # torch's store: its set-ups meet through it from C++
        load()._use_c10d_setup_store(route.fast_calls_address, store)


# What the creator needs of the group torch is creating and is not handed (torch 2.13's
# ``_DistributedBackendOptions`` holds store, group_rank, group_size, timeout, group_id and
# global_ranks_in_group; the backend's options are the second argument): the backend string's
# device-to-backend map and the bound device. Both are locals of torch's private
# ``_new_process_group_helper`` (``backend_config``, built from the string, and its parameter
# ``device_id``), read from its frame. ``frame_contract_problems()`` checks that they are still
# there, so that a torch that renames them fails a test (tests/torch/test_torch_native.py) rather
# than silently giving users torch's "custom" group.
HELPER_LOCALS = ("backend_config", "device_id")


def frame_contract_problems(helper=None):
    """What the installed torch no longer offers of the frame read (empty: all of it): the helper
    itself, its locals ``backend_config`` and ``device_id`` (a parameter), and
    ``BackendConfig.get_device_backend_map``."""
    helper = helper or getattr(dist.distributed_c10d, "_new_process_group_helper", None)
    if helper is None or not hasattr(helper, "__code__"):
        return ["torch.distributed.distributed_c10d._new_process_group_helper is gone"]
    code = helper.__code__
    params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    problems = [f"{helper.__name__} has no local {name!r}" for name in HELPER_LOCALS
                if name not in code.co_varnames]
    if "device_id" in code.co_varnames and "device_id" not in params:
        problems.append(f"{helper.__name__}'s device_id is no longer a parameter")
    if not hasattr(dist.BackendConfig, "get_device_backend_map"):
        problems.append("BackendConfig.get_device_backend_map is gone")
    return problems


_warned = False


def _group_being_created(helper=None):
    """(device types the group's backend string gives commlib, the group's bound device, every
    backend of the string is commlib) of the group torch is creating, read from the frame of
    torch's ``_new_process_group_helper`` that called the creator (its ``backend_config`` and
    ``device_id``, which it passes no creator); None where the creator was not called from it, or
    (with a RuntimeWarning, once) where that frame lacks them: a torch this was not written for."""
    global _warned
    helper = helper or dist.distributed_c10d._new_process_group_helper
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not helper.__code__:
        frame = frame.f_back
    if frame is None:
        return None
    local = frame.f_locals
    config, device_id = local.get("backend_config"), local.get("device_id")
    missing = [n for n in HELPER_LOCALS if n not in local]
    if not missing and not isinstance(config, dist.BackendConfig):
        missing = ["backend_config of type BackendConfig"]
    del frame, local
    if missing:
        if not _warned:
            _warned = True
            warnings.warn(f"commlib: torch {torch.__version__}'s {helper.__name__} has no "
                          f"{', '.join(missing)}: commlib groups are torch's own "
                          "ProcessGroup, named 'custom' (docs/torch_backend.md, 'Registered')",
                          RuntimeWarning, stacklevel=2)
        return None
    mapping = {d: str(b) for d, b in config.get_device_backend_map().items()}
    only_commlib = all(b == "commlib" for b in mapping.values())
    return [torch.device(d) for d in mapping], device_id, only_commlib


def process_group(backend, dist_opts):
    """What the creator returns torch for the C++ backend ``backend`` (a CommlibBackend): a
    ``c10d::ProcessGroup`` set up as torch sets up its own for a plugin, whose
    ``getBackendName()`` is "commlib" (csrc/torch_backend/process_group.h), which torch takes as
    the group. ``backend`` itself (torch then builds its own group, named "custom") where taking
    torch's place would lose something torch adds: a backend string that gives other devices to
    other backends (the group torch builds holds them; its loop stops at a returned group),
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch wraps the backend in its ProcessGroupWrapper), or a
    creator not called from torch's group helper."""
    module = load()
    if module is None or not isinstance(backend, module.CommlibBackend):
        return backend
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        return backend
    creating = _group_being_created()
    if creating is None or not creating[2]:
        return backend
    devices, device_id, _ = creating
    # torch's group holds the f"{group_name}/" store; the creator gets f"{device}/" on top of it
    store = dist_opts.store.underlying_store
    return module.process_group(store, dist_opts.group_rank, dist_opts.group_size, backend, devices, device_id)


def python_group(backend):
    """The Python backend behind ``backend`` (a CommlibBackend, torch's ProcessGroupWrapper around
    one under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, or the Python group itself)."""
    backend = getattr(backend, "wrapped_pg", backend)
    return getattr(backend, "python_group", backend)
