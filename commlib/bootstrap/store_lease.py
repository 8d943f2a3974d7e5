"""Who owns the store that ``commlib.init()`` opened when it was given none.

That store (a client connection on every rank, and on rank 0 the server too) is used by every
communicator built over it: init's own, its ``split()`` children and its ``shrink()`` survivors,
for as long as any of them lives (a split or a shrink rendezvous through it, and so does a stream
engine's set-up). So no single communicator owns it: each holds one reference to a ``StoreLease``,
and ``close()`` (or the communicator's garbage collection) gives it back. The last one back closes
the client; on rank 0 it then also waits, bounded by the timeout, until no other client is still
connected before it stops the server, since other ranks' communicators use it as well (a rank whose
``init()`` is still running when rank 0 closes right after its own, or a split group without rank
0). A rank that died has no connection left, so it is not waited for.
"""
from __future__ import annotations

import os
import threading
import time

# How often the last release on rank 0 looks whether other ranks still use the server.
_POLL_S = 0.02


class StoreLease:
    """One reference-counted hold on init()'s store client and (rank 0) server; see the module
    docstring. Created holding one reference (init's communicator)."""

    def __init__(self, store, server, timeout: float):
        self.store = store
        self.server = server
        self._timeout = timeout
        self._refs = 1
        self._lock = threading.Lock()
        self._pid = os.getpid()  # a forked child holds the parent's store: never closes it

    @property
    def references(self) -> int:
        return self._refs

    def acquire(self) -> "StoreLease":
        """One more communicator uses the store (a split child or a shrink's survivors)."""
        with self._lock:
            if self._refs == 0:
                raise RuntimeError("the store was already closed: no communicator built over it was left open")
            self._refs += 1
        return self

    def release(self) -> None:
        """One communicator is done with the store; the last one closes it (see the module
        docstring). In a forked child it only drops the reference: the store is the parent's."""
        with self._lock:
            if self._refs == 0:
                return
            self._refs -= 1
            if self._refs:
                return
        if os.getpid() != self._pid:
            return
        if hasattr(self.store, "close"):
            self.store.close()
        if self.server is not None:
            deadline = time.monotonic() + self._timeout
            while self.server.connections > 0 and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            self.server.close()


__all__ = ["StoreLease"]
