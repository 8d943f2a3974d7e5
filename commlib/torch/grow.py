"""Growing a process group back, the default one or one from ``new_group``: ``grow_group`` (the
members, in the style of ``dist.shrink_group``) and ``join_group`` (each replacement process),
docs/fault_tolerance.md "torch".

torch has no ``grow_group``, so this module does what torch 2.13's ``shrink_group`` does after its
backend call, with the same private helpers of ``torch.distributed.distributed_c10d``, which a
torch release that renames them needs this file updated for:

- ``_get_default_group``, ``_world.pg_map`` (the group's backend string and store),
  ``_get_process_group_name``, ``get_process_group_ranks``, ``_world.pg_backend_config``,
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
  A ``new_group`` group's backend store is ``"<name>/"`` on the registered store, ``"<device>/"``
  on top. ``join_arguments`` and ``join_group`` rebuild that chain for a joiner (which has no
  default group), so that ``commlib.join`` meets the members' grow and later groups meet theirs.

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
    """The members' side: grow a process group by the processes that called ``join_group``
    (``Communicator.grow(n, timeout)``: ``n`` joiners, or whoever asked within ``timeout`` seconds
    with ``n=None``). Every member of the group calls it; the members keep their ranks in it and
    the joiners follow. On an error (PeerError, RendezvousError, on every rank alike) the group is
    left as it was. Returns the grown group.

    - The default group (``group=None``): the grown group becomes the default group, the old one
      and every other group are destroyed (as ``dist.shrink_group`` of the default group does):
      build DDP, FSDP2 and other groups again.
    - A group from ``new_group``: the grown group replaces it (the old one is destroyed, as
      ``dist.shrink_group`` of a non-default group does; the default group and the other groups
      stay). A joiner is in no group of the members' world, so the grown group maps only the
      members' global ranks (``dist.get_global_rank`` and ``src=``/``dst=`` arguments work for
      them; name a joiner by its group rank: ``group_src=``/``group_dst=``); on the joiner it is
      its default group (``join_group(..., group_name=)``)."""
    default = c10d._get_default_group()
    target = default if group is None else group
    if target != default and target not in c10d._world.pg_map:
        raise ValueError("group: not a live process group of this process (destroyed, or this rank is not in it)")
    old_backend = _python_backend(target)
    comm = old_backend.comm.grow(n, timeout)
    try:
        backend_string, store = c10d._world.pg_map[target]
        if target == default:
            return _install_default(comm, old_backend.options, old_backend._timeout, store, backend_string, old=default)
        return _install_subgroup(comm, old_backend, target, store, backend_string)
    except BaseException:
        comm.close()
        raise


def _install_subgroup(comm, old_backend, old, store, backend_string):
    """The grown group of a non-default ``old`` group, registered in its place (torch's
    ``shrink_group`` steps for a non-default group), the members' global ranks mapped."""
    members = c10d.get_process_group_ranks(old)  # global ranks, in group order
    name = c10d._get_process_group_name(old)
    backend_config = c10d._world.pg_backend_config.get(old, str(c10d.BackendConfig(backend_string)))
    backend = native.wrap(ProcessGroupCommlib(comm, comm.rank, comm.size, old_backend.options, old_backend._timeout))
    new_name = f"commlib-grown:{comm._prefix}"
    metadata = {"new_group_name": c10d.GroupName(new_name) if hasattr(c10d, "GroupName") else new_name,
                "store": store, "backend_config": backend_config, "original_group_name": name,
                "bound_device_id": getattr(old, "bound_device_id", None)}
    c10d._cleanup_original_group(old, False)
    pg = c10d._create_shrunk_process_group(backend, list(range(comm.size)), metadata, False)
    pg._set_group_desc(f"{name}:grown")
    c10d._register_pg_in_world(pg=pg, backend_name=backend_string, store=store,
                               group_name=metadata["new_group_name"], backend_config=backend_config,
                               rank_mapping={g: r for r, g in enumerate(members)})
    return pg


def _job_store(store, from_init_method: bool):
    """The store init_process_group registered: ``"default_pg"``-prefixed when it made it from an
    init_method (env://, tcp://, torchrun), as given with ``store=``."""
    if not isinstance(store, dist.Store):
        raise TypeError(f"store: expected a torch.distributed.Store, got {type(store).__name__}")
    if not isinstance(from_init_method, bool):
        raise TypeError(f"from_init_method: a bool, got {type(from_init_method).__name__}")
    return c10d.PrefixStore("default_pg", store) if from_init_method else store


def join_arguments(store, device: Optional[str] = None, from_init_method: bool = True,
                   group_name: str = DEFAULT_GROUP_NAME) -> dict:
    """``commlib.join``'s ``store`` and ``prefix`` for a replacement of a torch job: ``store`` is
    the job's torch store as the members' ``init_process_group`` got it (e.g.
    ``dist.TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)``), ``device`` the default group's
    growing backend ("cuda" where commlib serves CUDA, else "cpu"), ``from_init_method`` False
    when the members passed ``store=`` to ``init_process_group`` (torch then adds no prefix),
    ``group_name`` the name of the group that grows (``dist.distributed_c10d._get_process_group_name``
    on a member: ``"0"`` for the default group, torch's counter for a ``new_group``). Use as
    ``commlib.join(**join_arguments(store), timeout=...)``."""
    base = _job_store(store, from_init_method)
    if not isinstance(group_name, str) or not group_name:
        raise TypeError(f"group_name: the grown group's torch name (a non-empty str), got {group_name!r}")
    if device is None:
        device = "cuda" if "cuda" in served_devices() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: 'cpu' or 'cuda', got {device!r}")
    # init_process_group registers the default group's store as "0/" on the base, and a new_group's
    # backend store is "<name>/" on that registered store; each device's backend adds "<device>/"
    group_store = c10d.PrefixStore(f"{DEFAULT_GROUP_NAME}/", base)
    if group_name != DEFAULT_GROUP_NAME:
        group_store = c10d.PrefixStore(f"{group_name}/", group_store)
    chain = c10d.PrefixStore(f"{device}/", group_store)
    return {"store": chain, "prefix": f"{BACKEND_NAME}/{group_name}"}


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
