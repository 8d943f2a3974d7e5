"""A communicator's group methods: ``split`` (sub-groups), ``shrink`` (the survivors) and ``grow``
(replacements join); and the seam of the symmetric pool, a group-wide allocation (``_symmetric_pool``).

A mixin of :class:`commlib.core.communicator.Communicator`, kept apart because both only check
their arguments and hand over to the rendezvous that ``commlib.init`` gave the communicator
(``self._split``, ``self._shrink``): this module imports nothing of the layer that builds
communicators either.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from commlib.core.call_checks import as_int, as_seconds
from commlib.device.buffers import parse_device
from commlib.core.shrink import check_exclude
from commlib.errors import CommError


class GroupMethods:
    """``split`` and ``shrink`` of a Communicator (which holds the attributes they read)."""

    def split(self, color: Optional[int], key: Optional[int] = None,
              timeout: Optional[float] = None, device=None) -> Optional["GroupMethods"]:
        """Partition the ranks: those passing the same ``color`` form a new communicator, ordered
        by ``key`` (then by rank). Every rank must call it; ``color=None`` joins no group and
        returns None. Collective over this communicator. The new communicator has this one's
        timeout unless ``timeout`` (seconds) is given.

        ``device`` ("cuda:N", "emulated:N", a torch.device, or a device buffer): the new
        communicator's stream engine for that device is set up here, while every rank is in this
        collective call, instead of at its first device call (which waits until every rank makes
        one there: communicators whose first device calls come in different orders on different
        ranks, as a pipeline's two lanes do, would wait for one another until the timeout). Every
        rank of the new communicator must name the same kind of device.
        """
        device_key = None if device is None else parse_device(device)
        self._check_can_rebuild("split", self._split)
        if color is not None:
            color = as_int(color, "color")
            if color < 0:
                raise ValueError(f"color: must be a non-negative int or None, got {color!r}")
        if key is not None:
            key = as_int(key, "key")
        timeout = as_seconds(timeout)
        self._splits += 1
        child = self._split(self, color, self._rank if key is None else key, self._splits,
                            self._timeout if timeout is None else timeout)
        if child is not None and device_key is not None:
            try:
                child._device().setup(*device_key)
            except BaseException:
                child.abort("its stream engine could not be set up at split()")
                raise
        return child

    def shrink(self, exclude: Optional[Sequence[int]] = None,
               timeout: Optional[float] = None) -> "GroupMethods":
        """A new communicator of the survivors, ranks renumbered in order (docs/fault_tolerance.md).

        Called by every rank that stays (never by an excluded one), typically after a PeerError.
        ``exclude=None`` excludes the ranks this communicator sees gone (dead or closed); the
        survivors agree on the set through the store within ``timeout`` (default: this
        communicator's), or every one raises an error naming the disagreement, a live rank
        excluded, or a rank that died during the shrink (call shrink again then). This
        communicator stays usable for nothing but ``close()`` after a failure: close it.
        """
        self._check_can_rebuild("shrink", self._shrink)
        exclude = check_exclude(exclude, self._size)
        timeout = as_seconds(timeout)
        self._shrinks += 1
        return self._shrink(self, exclude, self._shrinks, self._timeout if timeout is None else timeout)

    def grow(self, n: Optional[int] = None, timeout: Optional[float] = None) -> "GroupMethods":
        """A new communicator of this one's ranks and the processes that joined (commlib.join),
        docs/fault_tolerance.md "Growing back". Collective over this communicator. ``n``: wait
        for that many joiners, up to ``timeout`` (default: this communicator's); ``n=None``:
        admit whoever asked to join within ``timeout`` seconds (at least one). This communicator's
        ranks keep their numbers; joiners follow, in the order they asked. Every rank (joiners
        too) raises the same error if one fails: PeerError when a rank or a joiner died during
        the grow (call grow again), RendezvousError when too few joined in time or a joiner runs
        another commlib version or settings (naming it). This communicator stays usable."""
        self._check_can_rebuild("grow", self._grow)
        if n is not None:
            n = as_int(n, "n")
            if n < 1:
                raise ValueError(f"n: must be a positive number of joiners or None, got {n!r}")
        timeout = as_seconds(timeout)
        if n is None and timeout is None:
            raise ValueError("timeout: grow(n=None) admits whoever asked within timeout: give n or timeout")
        self._grows += 1
        return self._grow(self, n, self._grows, self._timeout if timeout is None else timeout)

    def _check_can_rebuild(self, what, rendezvous):
        """Refuses ``what`` (split, shrink) without commlib.init's rendezvous, after close() or in a
        forked child."""
        if rendezvous is None:
            raise RuntimeError(f"{what}: this communicator was not built by commlib.init, which provides it")
        if self._closed:
            raise CommError(f"{what}: communicator (rank {self._rank}) is closed")
        if os.getpid() != self._pid:
            raise CommError(f"{what}: communicator (rank {self._rank}) was created in pid {self._pid} and "
                            f"is used in a forked child (pid {os.getpid()})")

    def _symmetric_pool(self, device):
        """The symmetric pool of ``device`` (commlib.device.empty; commlib/device/symmetric.py),
        made by this communicator's device route on first use (collectively)."""
        if self._closed:
            raise CommError(f"comm: communicator (rank {self._rank}) is closed")
        return self._device().symmetric_pool(*parse_device(device))
