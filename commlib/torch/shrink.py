"""``dist.shrink_group`` on commlib process groups (torch's ``Backend.shrink``).

torch 2.13's ``shrink_group(ranks_to_exclude, group, shrink_flags)`` looks up the group's backend
(``_get_backend``: a commlib group answers with itself, commlib/torch/devices.py), asks it
``supports_shrinking``, calls ``shrink(excluded, flags, opts)`` for the new backend, then wraps that
in a fresh ``ProcessGroup`` with ``_register_backend``, destroys the old group and, for the default
group, makes the new one the default. A commlib group is a Python ``ProcessGroup`` subclass (the
C++ ``Backend`` cannot be subclassed from Python), and ``_register_backend`` accepts only C++
backends: ``install()`` wraps that one helper of ``torch.distributed.distributed_c10d``
(``_create_shrunk_process_group``) so that, for commlib groups only, the shrunk group is used as it
is (as torch already does for Python groups in ``new_group``); every other backend takes torch's
own code unchanged.

``ShrinkMixin`` gives ``ProcessGroupCommlib`` the ``Backend.shrink`` API on top of
``Communicator.shrink`` (docs/fault_tolerance.md).
"""
from __future__ import annotations

import torch.distributed.distributed_c10d as c10d

from commlib.core.shrink import check_exclude

SHRINK_ABORT = getattr(c10d, "SHRINK_ABORT", 1)


class ShrinkMixin:
    """``supports_shrinking`` and ``shrink`` of ``ProcessGroupCommlib`` (needs ``_comm``,
    ``_options``, ``_timeout``, ``abort``-like ``_stop``)."""

    @property
    def supports_shrinking(self) -> bool:
        return True

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts=None):
        """A new group of this group's other ranks (what ``dist.shrink_group`` calls).

        ``ranks_to_exclude``: group ranks that died (every survivor passes the same list; see
        ``Communicator.shrink`` for the agreement and its errors). ``SHRINK_ABORT`` in
        ``shrink_flags`` first fails this group's in-flight work at once (its waiters get
        CommError) instead of letting it finish. ``opts``: ``commlib.torch.Options`` for the new
        group (default: this group's).
        """
        if opts is not None and not isinstance(opts, type(self._options)):
            raise TypeError(f"opts: expected commlib.torch.Options, got {type(opts).__name__}")
        if ranks_to_exclude is None:
            raise TypeError("ranks_to_exclude: expected a list of ranks (commlib.torch.dead_ranks(group)), got None")
        # Checked as every call checks ranks (np.int64 and 0-d tensors pass), before the abort.
        exclude = check_exclude(ranks_to_exclude, self._comm.size, "ranks_to_exclude")
        if shrink_flags & SHRINK_ABORT:
            # Fail queued and running calls now; the communicator's links stay open for the
            # agreement (peer liveness), and torch destroys this group after the shrink.
            self._comm.abort("aborted by shrink_group(SHRINK_ABORT)")
        comm = self._comm.shrink(exclude=exclude)
        return type(self)(comm, comm.rank, comm.size, opts or self._options, self._timeout)


def _is_commlib(pg) -> bool:
    return isinstance(pg, ShrinkMixin)  # ProcessGroupCommlib (this module sits below backend.py)


def install():
    """Route commlib groups through ``dist.shrink_group`` (idempotent; see the module docstring)."""
    if getattr(c10d, "_commlib_shrink_installed", False):
        return
    if not hasattr(c10d, "_create_shrunk_process_group"):
        return  # a torch without shrink_group: nothing to route
    create = c10d._create_shrunk_process_group

    def create_group(new_backend, remaining_ranks, metadata, is_default_group):
        if not _is_commlib(new_backend):
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        new_backend._set_group_desc("default:shrunken" if is_default_group
                                    else f"{metadata['original_group_name']}:shrunk")
        if metadata.get("bound_device_id") is not None:
            new_backend.bound_device_id = metadata["bound_device_id"]
        return new_backend

    c10d._create_shrunk_process_group = create_group
    c10d._commlib_shrink_installed = True
