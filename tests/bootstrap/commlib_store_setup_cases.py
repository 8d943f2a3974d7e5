"""Rank side of test_set_up_over_commlib_store.py: the stream engine's set-up over commlib's own
store (TCPStore, or a SignedStore over one under COMMLIB_SECRET) goes through the C++ client
(csrc/bindings/commlib_setup_store.h) once the device route read the store: a spy on the Python
store object sees no call during the set-up; and a store server killed during the set-up gives the
error the Python store gave (StoreLostError naming the store, the operation and the key)."""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np

import commlib.emulated as emu
from commlib import _C
from commlib.bootstrap.secret import SignedStore
from commlib.bootstrap.wait import wait_for_key
from commlib.testing.faults import mark_reached, wait_until_reached

STORE_METHODS = ("set", "get", "check", "add", "wait")


def _spy_on_store(store, seen):
    """Every method of STORE_METHODS of the store object (and of its inner store, for a signed one)
    appends its name to ``seen``; returns a function that takes the spies off."""
    objects = [store] + ([store.inner] if isinstance(store, SignedStore) else [])
    for obj in objects:
        for name in STORE_METHODS:
            real = getattr(obj, name, None)
            if real is None:  # (a SignedStore has no wait)
                continue

            def spy(*args, _name=name, _real=real, **kwargs):
                seen.append(_name)
                return _real(*args, **kwargs)
            setattr(obj, name, spy)

    def off():
        for obj in objects:
            for name in STORE_METHODS:
                obj.__dict__.pop(name, None)
    return off


def set_up_sees_no_python_store_call(comm):
    """A fresh communicator (a split: no engine yet) makes its first call on emulated memory, which
    sets its engine up through the store. Returns (the store's class, store calls the spy saw during
    the first call, store operations the set-up made through a Python object, whether the route's
    set-ups still use the Python object, the result exact). The communicator stays open (close_kept)."""
    P, r = comm.size, comm.rank
    sub = comm.split(0, timeout=30)
    store = sub._store
    sub._device()  # the route: the store is read here, once
    seen = []
    off = _spy_on_store(store, seen)
    ops = _C.python_setup_store_calls()
    try:
        x = emu.from_numpy(np.full(33, r + 1, np.int32))
        sub.all_reduce(x)
        right = bool(np.array_equal(x.numpy(), np.full(33, P * (P + 1) // 2, np.int32)))
    finally:
        ops = _C.python_setup_store_calls() - ops
        off()
    python_store = sub._device()._setups.python_store()
    _KEPT.append(sub)  # open until close_kept: the test counts the server's connections meanwhile
    return type(store).__name__, seen, ops, python_store, right


_KEPT = []


def close_kept(comm):
    """Closes the communicators set_up_sees_no_python_store_call kept open."""
    while _KEPT:
        _KEPT.pop().close()


def set_up_while_the_store_dies(comm):
    """Rank 0 makes its first device call; rank 1 makes none, so rank 0's set-up waits on the store
    for rank 1's handle until the test kills the store server. Returns rank 0's ("Class", message)
    (rank 1: None)."""
    if comm.rank != 0:
        return None
    try:
        comm.all_reduce(emu.from_numpy(np.ones(8, np.float32)))
    except Exception as e:  # noqa: BLE001 - the class and message are the result
        return type(e).__name__, str(e)
    return "no error", ""


FORGED = b"CLS1" + bytes(32) + b"forged handle"  # signed-looking, with a tag no key makes


def set_up_meets_a_tampered_handle(comm):
    """Under COMMLIB_SECRET: rank 1 plants a forged handle under its own set-up key (written past the
    signing, through the inner store) and makes no device call; rank 0's first device call reads it
    in its set-up from C++. Returns rank 0's ("Class", message) and the forged key (rank 1: None)."""
    sub = comm.split(0, timeout=30)
    key = f"{sub._prefix}/device1/1"
    try:
        if sub.rank == 1:
            sub._store.inner.set(key, FORGED)
            sub.barrier()
            return None
        sub.barrier()
        try:
            sub.all_reduce(emu.from_numpy(np.ones(8, np.float32)))
        except Exception as e:  # noqa: BLE001 - the class and message are the result
            return type(e).__name__, str(e), key
        return "no error", "", key
    finally:
        sub.close()


def set_up_while_a_thread_holds_the_gil(comm, hold_s):
    """Rank 0's set-up waits for rank 1 while another thread of rank 0 holds the GIL for ``hold_s``
    (a C call made through ctypes.PyDLL keeps it); rank 1 sets up meanwhile. Rank 0's set-up meets
    rank 1 without the GIL (handles, the link setting), so rank 1's set-up need not wait for the
    GIL to come back. Returns rank 1's set-up seconds, and on rank 0 how long the GIL was held."""
    sub = comm.split(0, timeout=60)
    route = sub._device()
    if sub.rank == 0:
        held = []

        def hold():
            # Rank 0's set-up published its handle: it waits for rank 1, the GIL released.
            wait_for_key(sub._store, f"{sub._prefix}/device1/0", time.monotonic() + 60,
                         on_timeout=lambda: TimeoutError("rank 0's set-up did not start"))
            libc = ctypes.PyDLL(None)  # (PyDLL: the GIL stays held through the call)
            libc.sleep.argtypes = [ctypes.c_uint]
            mark_reached(sub, "holding the GIL")
            start = time.monotonic()
            libc.sleep(hold_s)
            held.append(time.monotonic() - start)
        t = threading.Thread(target=hold)
        t.start()
        route.setup("emulated", 0)
        t.join()
        took = held[0]
    else:
        wait_until_reached(sub, "holding the GIL", [0])
        start = time.monotonic()
        route.setup("emulated", 0)
        took = time.monotonic() - start
    sub.close()
    return took
