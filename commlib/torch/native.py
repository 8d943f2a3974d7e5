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
from pathlib import Path
from typing import Optional

import torch

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
    return module.CommlibBackend(group, core, group.rank(), group.size(), algorithms, wrap)


def python_group(backend):
    """The Python backend behind ``backend`` (a CommlibBackend, torch's ProcessGroupWrapper around
    one under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, or the Python group itself)."""
    backend = getattr(backend, "wrapped_pg", backend)
    return getattr(backend, "python_group", backend)
