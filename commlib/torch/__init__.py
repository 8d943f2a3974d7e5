"""PyTorch integration: importing this module registers the torch.distributed backend "commlib".

    import torch.distributed as dist, commlib.torch
    dist.init_process_group("commlib")          # env://, tcp:// or store= as usual

Every process group on this backend (the default group, ``new_group``, DeviceMesh dimensions)
runs its collectives on its own commlib communicator. ``Options(algorithms={...})`` passed as
``pg_options`` picks an algorithm per collective; ``COMMLIB_ALGO_<COLLECTIVE>`` works as well.
See docs/torch_backend.md for what works and what does not.
"""
import torch as _torch
import torch.distributed as _dist

from commlib.torch import native as _native

from commlib.torch import shrink as _shrink
from commlib.torch.backend import COLLECTIVES, Options, ProcessGroupCommlib, _create
from commlib.torch.devices import served_devices
from commlib.torch.grow import grow_group, join_arguments, join_group

BACKEND_NAME = "commlib"


def _register():
    if "COMMLIB" in _dist.Backend._plugins:  # already registered (module re-imported)
        return
    # "cpu" always, "cuda" only where the CUDA path can serve it (devices.py says when)
    _dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=served_devices())


_native.load()  # refuses a C++ backend built against another torch, at import (native.py)
_register()
_shrink.install()  # dist.shrink_group on commlib groups (commlib/torch/shrink.py)


def python_group(group=None) -> ProcessGroupCommlib:
    """The Python backend of ``group`` (default: the default group): its communicator
    (``.comm``), its ``Options`` (``.options``), and the calls the C++ backend hands it."""
    from torch.distributed.distributed_c10d import _get_default_group
    pg = group if group is not None else _get_default_group()
    if not isinstance(pg, ProcessGroupCommlib):
        try:  # a torch ProcessGroup whose CPU backend is commlib's C++ backend (native.py)
            pg = _native.python_group(pg._get_backend(_torch.device("cpu")))
        except (RuntimeError, AttributeError, TypeError):
            pass
    if not isinstance(pg, ProcessGroupCommlib):
        raise TypeError(f"group: not a commlib process group ({type(pg).__name__})")
    return pg


def get_communicator(group=None):
    """The commlib communicator behind ``group`` (default: the default group)."""
    return python_group(group).comm


def dead_ranks(group=None):
    """The ranks of ``group`` (default: the default group) that its communicator sees gone (dead
    or closed), sorted: what the survivors pass to ``dist.shrink_group`` after a PeerError."""
    from commlib.core.shrink import gone_ranks
    return sorted(gone_ranks(get_communicator(group)))


__all__ = ["BACKEND_NAME", "COLLECTIVES", "Options", "ProcessGroupCommlib", "dead_ranks",
           "get_communicator", "grow_group", "join_arguments", "join_group", "python_group"]
