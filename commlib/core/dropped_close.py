"""What a communicator dropped without ``close()`` still has to give back, given back when it is
garbage collected: its device route's engines and its reference to ``commlib.init()``'s store.

An engine's exported memory (the inbox, the kernel path's region) is freed only after the closing
barrier says every rank closed its imports of it (commlib/core/device_close.py); an engine simply
destroyed leaves it allocated, with its descriptors (two memfds on the emulated device, an event).
So a dropped communicator closes its route as ``close()`` would: on a thread of its own, since the
barrier waits (bounded) for the peers, which garbage collection must not. The thread is not a
daemon: the interpreter's exit waits for it rather than tearing C++ state down under it. The store
reference goes last (the barrier uses the store).
"""
from __future__ import annotations

import logging
import os
import threading

from commlib.errors import CommError


class Leftovers:
    """The callback of a communicator's ``weakref.finalize`` (it holds no reference to the
    communicator): ``route`` and ``lease`` are set as the communicator acquires them."""

    __slots__ = ("route", "lease", "pid", "__weakref__")

    def __init__(self):
        self.route = None  # commlib.core.device_route.DeviceRoute, once made
        self.lease = None  # commlib.bootstrap.store_lease.StoreLease, if init() opened the store
        self.pid = os.getpid()  # a forked child gives back nothing: they are the parent's

    def __call__(self):
        if os.getpid() != self.pid or (self.route is None and self.lease is None):
            return
        try:
            threading.Thread(target=self.give_back, name="commlib-dropped-close").start()
        except RuntimeError:  # the interpreter is shutting down: the process's exit frees them
            pass

    def give_back(self):
        route, lease, self.route, self.lease = self.route, self.lease, None, None
        try:
            if route is not None:
                route.close()
        except CommError as e:  # a device call's error no caller was told (route.close raises it)
            logging.getLogger("commlib").error("a communicator dropped without close(): %s: %s",
                                               type(e).__name__, e)
        finally:
            if lease is not None:
                lease.release()


__all__ = ["Leftovers"]
