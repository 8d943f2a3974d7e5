"""The two routes the error matrix (error_cases.py) runs on, each with only what is its own: its
buffers, how a call is made and waited for, the bad arguments only it has, and what it holds
besides threads and descriptors (which the leak check counts).

The host route takes NumPy arrays and blocking calls; the device route (the stream engine, on
commlib.emulated arrays, no GPU needed) enqueues each call and waits for its work, so a failure
shows on the work. Scenarios name the route ("host" or "device": a name travels to the rank
processes) and look it up here with ``route(name)``.
"""
from __future__ import annotations

import os

import numpy as np


def _emu():
    import commlib.emulated as emu
    return emu


def commlib_mappings():
    """The commlib shared-memory regions this process maps."""
    with open("/proc/self/maps") as f:
        return sum("commlib" in line for line in f)


class HostRoute:
    name = "host"
    # kill_during_collective: the victim's buffer (large enough that it is inside the call when it
    # dies) and its sub-communicator's timeout; silent_peer's timeout.
    KILL_COUNT, KILL_TIMEOUT = 1 << 20, 30
    SILENT_TIMEOUT = 2.0
    TIMEOUT_WORDS = ("did not answer",)  # what a timed-out call's message says besides rank and call

    @staticmethod
    def full(n, dtype, value):
        return np.full(n, value, dtype)

    @staticmethod
    def call(fn):
        """Make the call fn(**kwargs) and wait for it (raising its error)."""
        fn()

    @staticmethod
    def wait(work):
        work.wait()

    @staticmethod
    def read(x):
        """A host copy of ``x`` (on the device route: once its stream has run)."""
        return np.array(x)

    @staticmethod
    def warm_up(comm):
        """Nothing to set up before a scenario times a call."""

    @staticmethod
    def settle():
        """Nothing runs on after a call returns."""

    @staticmethod
    def held():
        return commlib_mappings()

    @staticmethod
    def own_bad_arguments(comm, buf):
        """Bad calls that only host arrays can make: ``buf`` is 8 float32 elements."""
        return [
            (lambda: comm.all_reduce(buf, out=np.zeros(8, np.float64)), TypeError, "out"),
            (lambda: comm.all_reduce(np.zeros((4, 4), np.float32).T), ValueError, "tensor"),
            (lambda: comm.all_reduce(np.zeros(4, np.complex64)), TypeError, "tensor"),
            (lambda: comm.all_reduce([1.0, 2.0]), TypeError, "tensor"),
            (lambda: comm.all_gather(np.zeros(8 * comm.size, np.int32), buf), TypeError, "output"),
        ]


class DeviceRoute:
    name = "device"
    KILL_COUNT, KILL_TIMEOUT = 1 << 16, 60
    SILENT_TIMEOUT = 1.5
    TIMEOUT_WORDS = ("did not answer", "COMMLIB_TIMEOUT")

    @staticmethod
    def full(n, dtype, value):
        return _emu().from_numpy(np.full(n, value, dtype))

    @staticmethod
    def call(fn):
        fn(async_op=True).synchronize()

    @staticmethod
    def wait(work):
        work.synchronize()

    @staticmethod
    def read(x):
        return x.numpy()

    @staticmethod
    def warm_up(comm):
        """The first device call of a communicator sets up its stream engine, a rendezvous of all
        ranks on the host; scenarios that time a call or run host calls in between make it first."""
        x = DeviceRoute.full(4, "float32", 1)
        comm.all_reduce(x)
        x.numpy()

    @staticmethod
    def settle():
        _emu().synchronize()

    @staticmethod
    def held():
        return commlib_mappings(), _emu().device().allocated_bytes()

    @staticmethod
    def own_bad_arguments(comm, buf):
        """Bad calls that only device arrays can make (host arrays beside them, streams)."""
        emu, P = _emu(), comm.size
        return [
            (lambda: comm.all_reduce(buf, out=np.zeros(8, np.float32)), ValueError, "out"),
            (lambda: comm.all_reduce(buf, out=emu.empty(8, "int32")), TypeError, "out"),
            (lambda: comm.all_reduce(buf, stream="s"), TypeError, "stream"),
            (lambda: comm.all_reduce(np.zeros(8, np.float32), stream=emu.Stream()), ValueError, "stream"),
            (lambda: comm.batch_p2p([("send", buf, 1), ("recv", np.zeros(8, np.float32), 1)]), ValueError,
             "tensor"),
            (lambda: comm.recv(np.zeros(8, np.float32), 1, stream=emu.Stream()), ValueError, "stream"),
            # (the stream engine takes one send to and one receive from each peer per batch; host batches any number)
            (lambda: comm.batch_p2p([("send", buf, 1 % P), ("send", buf, 1 % P)]), ValueError, "ops"),
            (lambda: comm.all_to_all(buf, buf, input_splits=[8] + [0] * (P - 1), output_splits=[8] + [0] * (P - 1)),
             ValueError, "overlaps"),
        ]


ROUTES = {r.name: r for r in (HostRoute, DeviceRoute)}


def route(name):
    return ROUTES[name]


def threads():
    return len(os.listdir("/proc/self/task"))


def fds():
    return len(os.listdir("/proc/self/fd"))
