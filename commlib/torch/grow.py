"""Growing the default process group back: ``grow_group`` (the members, in the style of
``dist.shrink_group``) and ``join_group`` (each replacement process), docs/fault_tolerance.md.

torch has no ``grow_group``, so this module does what torch 2.13's ``shrink_group`` does after its
backend call, with the same private helpers of ``torch.distributed.distributed_c10d``, which a
torch release that renames them needs this file updated for:

- ``_get_default_group``, ``_world.pg_map`` (the group's backend string and store),
  ``_destroy_all_other_groups`` (shrinking or growing the default group
  renumbers the world, so other groups are gone: build them again),
  ``_cleanup_original_group`` (destroy the old default group and forget it),
  ``_create_shrunk_process_group`` (wraps a C++ backend in a ``ProcessGroup``; commlib/torch/shrink.py
  makes it take a Python commlib group as it is), ``_update_default_pg`` and ``_register_pg_in_world``.
- The store layout of the default group: ``init_process_group`` prefixes its store with
  ``"default_pg"`` (when it made the store from an init_method), the default group is named
  ``"0"`` (the first group: ``_world.group_count`` was 0) and registered (``_world.pg_map``, the
  store ``new_group`` builds on) with ``"0/"`` added, and each device's backend gets
  ``"<device>/"`` on top; commlib's ``_create`` names the job ``"commlib/<group name>"``.
  ``join_arguments`` and ``join_group`` rebuild that chain for a joiner (which has no default
  group), so that ``commlib.join`` meets the members' grow and later groups meet theirs.

The grown group's name is made from the grow's communicator prefix (the same on every rank),
not torch's hash of the ranks and the number of groups this process has seen (which a joiner has
not). Groups created afterwards (``new_group``) are named by torch's group counter, which
destroying the old default group reset to 0 on the members as a joiner's is, so they agree.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commlib.torch import native
from commlib.torch.backend import Options, ProcessGroupCommlib
from commlib.torch.devices import BACKEND_NAME, served_devices

DEFAULT_GROUP_NAME = "0"  # torch's name for the first group it creates, the default one


def _device_of(pg) -> torch.device:
    """The device whose backend torch's shrink_group would take for ``pg`` (bound, else cuda,
    else cpu): the one that grows."""
    bound = getattr(pg, "bound_device_id", None)
    if bound is not None:
        return bound
    for kind in ("cuda", "cpu"):
        try:
            pg._get_backend(torch.device(kind))
            return torch.device(kind)
        except (RuntimeError, ValueError):
            continue
    raise TypeError("group: it has no commlib backend on the CPU or CUDA")


def _python_backend(pg) -> ProcessGroupCommlib:
    backend = native.python_group(pg._get_backend(_device_of(pg))) if not isinstance(pg, ProcessGroupCommlib) \
        else pg
    if not isinstance(backend, ProcessGroupCommlib):
        raise TypeError(f"group: not a commlib process group ({type(backend).__name__})")
    return backend


def _install_default(comm, options, timeout, store, backend_string, old=None):
    """Make a group over ``comm`` the default group (after destroying ``old``, the previous
    default group, and every other group), registered with ``store`` and ``backend_string`` as
    init_process_group's."""
    backend_config = str(c10d.BackendConfig(backend_string))
    group = ProcessGroupCommlib(comm, comm.rank, comm.size, options, timeout)
    backend = native.wrap(group)
    name = c10d.GroupName(f"commlib-grown:{comm._prefix}") if hasattr(c10d, "GroupName") \
        else f"commlib-grown:{comm._prefix}"
    metadata = {"new_group_name": name, "store": store, "backend_config": backend_config,
                "original_group_name": "default", "bound_device_id": getattr(old, "bound_device_id", None)}
    if old is not None:
        c10d._destroy_all_other_groups(exclude_group=old)
        c10d._cleanup_original_group(old, True)
    pg = c10d._create_shrunk_process_group(backend, list(range(comm.size)), metadata, True)
    pg._set_group_desc("default:grown")
    c10d._update_default_pg(pg)
    c10d._register_pg_in_world(pg=pg, backend_name=backend_string, store=store, group_name=name, backend_config=backend_config,
                               rank_mapping={r: r for r in range(comm.size)})
    return pg


def grow_group(n: Optional[int] = None, group=None, timeout: Optional[float] = None):
    """The members' side: grow the default process group by the processes that called
    ``join_group`` (``Communicator.grow(n, timeout)``: ``n`` joiners, or whoever asked within
    ``timeout`` seconds with ``n=None``). Every member calls it; the members keep their ranks and
    the joiners follow. The grown group becomes the default group, the old one and every other
    group are destroyed (as ``dist.shrink_group`` of the default group does): build DDP, FSDP2
    and other groups again. On an error (PeerError, RendezvousError, on every rank alike) the
    default group is left as it was. Returns the new default group."""
    default = c10d._get_default_group()
    if group is not None and group != default:
        raise ValueError("group: only the default group can grow (a joiner has no other group to join)")
    old_backend = _python_backend(default)
    comm = old_backend.comm.grow(n, timeout)
    try:
        backend_string, store = c10d._world.pg_map[default]
        return _install_default(comm, old_backend.options, old_backend._timeout, store, backend_string, old=default)
    except BaseException:
        comm.close()
        raise


def _job_store(store, from_init_method: bool):
    """The store init_process_group registered: ``"default_pg"``-prefixed when it made it from an
    init_method (env://, tcp://, torchrun), as given with ``store=``."""
    if not isinstance(store, dist.Store):
        raise TypeError(f"store: expected a torch.distributed.Store, got {type(store).__name__}")
    if not isinstance(from_init_method, bool):
        raise TypeError(f"from_init_method: a bool, got {type(from_init_method).__name__}")
    return c10d.PrefixStore("default_pg", store) if from_init_method else store


def join_arguments(store, device: Optional[str] = None, from_init_method: bool = True) -> dict:
    """``commlib.join``'s ``store`` and ``prefix`` for a replacement of a torch job: ``store`` is
    the job's torch store as the members' ``init_process_group`` got it (e.g.
    ``dist.TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)``), ``device`` the default group's
    growing backend ("cuda" where commlib serves CUDA, else "cpu"), ``from_init_method`` False
    when the members passed ``store=`` to ``init_process_group`` (torch then adds no prefix). Use
    as ``commlib.join(**join_arguments(store), timeout=...)``."""
    base = _job_store(store, from_init_method)
    if device is None:
        device = "cuda" if "cuda" in served_devices() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: 'cpu' or 'cuda', got {device!r}")
    chain = c10d.PrefixStore(f"{device}/", c10d.PrefixStore(f"{DEFAULT_GROUP_NAME}/", base))
    return {"store": chain, "prefix": f"{BACKEND_NAME}/{DEFAULT_GROUP_NAME}"}


def join_group(comm, store, pg_options: Optional[Options] = None, timeout=None, from_init_method: bool = True):
    """A replacement's side of ``grow_group``: make the communicator ``commlib.join`` returned
    (``commlib.join(**join_arguments(store))``) this process's default process group, as
    ``init_process_group`` would have (``store`` and ``from_init_method``: as given to
    ``join_arguments``; ``timeout``: a timedelta, default the communicator's). Collective with the
    members' ``grow_group``. Returns the default group; then build DDP or FSDP2 as the members do."""
    if dist.is_initialized():
        raise RuntimeError("join_group: this process already has a default process group")
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(f"pg_options: expected commlib.torch.Options, got {type(pg_options).__name__}")
    base = _job_store(store, from_init_method)
    from datetime import timedelta
    if timeout is None:
        timeout = timedelta(seconds=comm._timeout)
    # what the members' default group is registered with: init_process_group's group store
    group_store = c10d.PrefixStore(f"{DEFAULT_GROUP_NAME}/", base)
    return _install_default(comm, pg_options or Options(), timeout, group_store, BACKEND_NAME)


__all__ = ["grow_group", "join_arguments", "join_group"]
