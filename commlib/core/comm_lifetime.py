"""A communicator's life cycle: ``close`` and the context manager, and the store it shares with the
communicators built over init()'s store (``abort``: commlib/core/failure.py).

A mixin of :class:`commlib.core.communicator.Communicator` (one concept per file): what it gives
back when closed (the device route, the core, init()'s store lease) and what garbage collection
gives back when close() never ran (commlib/core/dropped_close.py).
"""
from __future__ import annotations

import os

from commlib.errors import CommError


class LifetimeMethods:
    """close of a Communicator (which holds ``_core``, ``_device_route``, ``_leftovers``,
    ``_dropped``, ``_lease`` and ``_pid``)."""

    def close(self):
        """Finish queued work, then release shared memory and the worker thread. Idempotent. Then
        raises the error of a device call no call, ``wait()`` or ``synchronize()`` raised (e.g. a
        mismatched last call: docs/gpu.md). init()'s store closes with the last communicator over
        it (commlib/bootstrap/store_lease.py); a forked child only drops its references."""
        self._closed = True
        unreported = None
        self._dropped.detach()  # given back here, not again at garbage collection
        lease, self._leftovers.lease = self._leftovers.lease, None
        self._leftovers.route = None
        if self._device_route is not None:  # before the transport its peer watch uses
            try:
                self._device_route.close()
            except CommError as e:  # a device call's error no caller was told: raised once all is closed
                unreported = e
        self._core.close()
        if lease is not None and os.getpid() == self._pid:
            lease.release()  # once: the last communicator over init()'s store closes it
        if unreported is not None:
            raise unreported

    def _hold_store(self, lease):
        """Share ``lease`` (a commlib.bootstrap.store_lease.StoreLease this communicator now holds a
        reference of): given back by close(), or when this communicator is garbage collected."""
        self._lease = self._leftovers.lease = lease

    @property
    def _owned(self):
        """(store client, store server) that init() opened and this communicator still holds a
        reference of, else (None, None)."""
        if self._leftovers.lease is None:
            return None, None
        return self._lease.store, self._lease.server

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
