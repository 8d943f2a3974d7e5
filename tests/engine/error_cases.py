"""Rank-side error scenarios. Each one that aborts a communicator does it on a fresh
sub-communicator from ``comm.split`` so the pool's world communicator stays usable."""
from __future__ import annotations

import os
import signal
import time

import numpy as np

import commlib


def _raises(fn, exc_type):
    """Run fn; return (exception message, seconds) if it raised exc_type, else raise AssertionError."""
    t = time.monotonic()
    try:
        fn()
    except exc_type as e:
        return str(e), time.monotonic() - t
    raise AssertionError(f"expected {exc_type.__name__}")


def check_refused(cases):
    """Runs each (call, exception type, word) case; returns what went wrong: a call that did not
    raise, raised another type, or whose message does not name the word (the argument)."""
    seen = []
    for i, (call, exc, word) in enumerate(cases):
        try:
            call()
        except exc as e:
            if word not in str(e):
                seen.append(f"case {i}: message does not name '{word}': {e}")
        except Exception as e:  # noqa: BLE001
            seen.append(f"case {i}: raised {type(e).__name__} instead of {exc.__name__}: {e}")
        else:
            seen.append(f"case {i}: did not raise")
    return seen


def bad_arguments(comm):
    """Rank 0 makes every bad call; none may send anything, which the final all_reduce proves
    (a stray message would show up there as a MismatchError)."""
    P, r = comm.size, comm.rank
    seen = []
    if r == 0:
        f32 = np.zeros(8, np.float32)
        cases = [
            (lambda: comm.all_reduce(f32, out=np.zeros(8, np.float64)), TypeError, "out"),
            (lambda: comm.all_reduce(f32, out=np.zeros(9, np.float32)), ValueError, "out"),
            (lambda: comm.all_reduce(np.zeros((4, 4), np.float32).T), ValueError, "tensor"),
            (lambda: comm.all_reduce(np.zeros(4, np.complex64)), TypeError, "tensor"),
            (lambda: comm.all_reduce([1.0, 2.0]), TypeError, "tensor"),
            (lambda: comm.all_reduce(f32, algorithm="nope"), ValueError, "algorithm"),
            (lambda: comm.all_reduce(f32, op="band"), ValueError, "op"),
            (lambda: comm.all_reduce(f32, op="mean"), ValueError, "op"),
            (lambda: comm.all_reduce(f32, op="premul_sum"), ValueError, "scale"),
            (lambda: comm.all_reduce(f32, scale=2.0), ValueError, "scale"),
            (lambda: comm.all_gather(np.zeros(8 * P + 1, np.float32), f32), ValueError, "output"),
            (lambda: comm.all_gather(np.zeros(8 * P, np.int32), f32), TypeError, "output"),
            (lambda: comm.reduce_scatter(f32, np.zeros(8 * P + 2, np.float32)), ValueError, "input"),
            (lambda: comm.all_to_all(np.zeros(8, np.float32), np.zeros(7, np.float32)), ValueError, "output"),
            (lambda: comm.all_to_all(f32, f32.copy(), input_splits=[8] + [0] * (P - 1),
                                     output_splits=[1] * P), ValueError, "splits"),
            (lambda: comm.broadcast(f32, root=P), ValueError, "root"),
            (lambda: comm.broadcast(f32, root=-1), ValueError, "root"),
            (lambda: comm.reduce(f32, root=P + 3), ValueError, "root"),
            (lambda: comm.gather(None, f32, root=0), ValueError, "output"),
            (lambda: comm.scatter(f32, None, root=0), ValueError, "input"),
            (lambda: comm.send(f32, P), ValueError, "peer"),
            (lambda: comm.send(f32, 0), ValueError, "peer"),
            (lambda: comm.recv(f32, -1), ValueError, "peer"),
            (lambda: comm.batch_p2p([("send", f32, 1 % P), ("send", f32, 1 % P)]), ValueError, "ops"),
            (lambda: comm.batch_p2p([("put", f32, 1 % P)]), ValueError, "ops"),
            (lambda: comm.split(-2), ValueError, "color"),
        ]
        seen += check_refused(cases)
    x = np.full(5, r, np.int64)
    comm.all_reduce(x)
    if not (x == sum(range(P))).all():
        seen.append(f"follow-up all_reduce wrong: {x}")
    return seen


class HostCalls:
    """How the host cases make buffers and calls: NumPy arrays, blocking calls. The device cases
    (tests/device/device_error_cases.py) pass one of commlib.emulated arrays whose calls are
    enqueued and then synchronised, to the same scenario functions."""

    @staticmethod
    def full(n, dtype, value):
        return np.full(n, value, dtype)

    @staticmethod
    def call(fn):
        """Make the call fn(**kwargs) and wait for it (raising its error)."""
        fn()


def mismatch(comm, scenario, calls=HostCalls):
    """Ranks call different things on a fresh sub-communicator; every rank must get a
    MismatchError (from the call or, for a rank whose part needed nothing back, the next call)
    naming both calls, within seconds."""
    sub = comm.split(0, timeout=60)
    r = sub.rank
    x = calls.full(64, "float32", 1)
    if scenario == "collective":  # rank 0 all_gather, everyone else all_reduce
        out = calls.full(64 * sub.size, "float32", 0)
        call = (lambda **kw: sub.all_gather(out, x, **kw)) if r == 0 else (lambda **kw: sub.all_reduce(x, **kw))
        names = ("all_gather", "all_reduce")
    elif scenario == "count":
        y = calls.full(64 + (r == 1), "float32", 1)
        call = lambda **kw: sub.all_reduce(y, algorithm="ring", **kw)  # noqa: E731
        names = ("65", "64")
    elif scenario == "dtype":
        y = calls.full(64, "float32" if r else "float64", 1)
        call = lambda **kw: sub.all_reduce(y, algorithm="ring", **kw)  # noqa: E731
        names = ("float32", "float64")
    elif scenario == "algorithm":
        call = lambda **kw: sub.all_reduce(x, algorithm="ring" if r else "recursive_doubling", **kw)  # noqa: E731
        names = ("ring", "recursive_doubling")
    elif scenario == "root":
        call = lambda **kw: sub.reduce(x, root=0 if r == 0 else 1, **kw)  # noqa: E731
        names = ("root 0", "root 1")
    else:
        raise ValueError(scenario)
    t = time.monotonic()
    try:
        calls.call(call)
        # A rank whose part was only to send learns of the mismatch at its next call.
        calls.call(lambda **kw: sub.all_reduce(x, **kw))
        msg = None
    except commlib.MismatchError as e:
        msg = str(e)
    except commlib.CommError as e:
        msg = f"wrong type {type(e).__name__}: {e}"
    took = time.monotonic() - t
    # The sub-communicator is aborted: later calls raise at once.
    later = None
    t2 = time.monotonic()
    try:
        calls.call(lambda **kw: sub.all_reduce(x, **kw))
    except commlib.CommError:
        later = time.monotonic() - t2
    sub.close()
    return msg, took, later, names


def kill_during_collective(comm, victim):
    """``victim`` dies (SIGKILL) inside an all_reduce; the others must raise PeerError naming it,
    the collective and its sequence number.

    To be sure the victim is inside the call when it dies, one other rank ("late") joins the call
    only after the kill: the victim is then blocked waiting for that rank's data. The remaining
    ranks are inside the call when the victim dies; the late one starts after it.
    """
    import threading
    sub = comm.split(0, timeout=30)
    late = min(q for q in range(sub.size) if q != victim)
    x = np.ones(1 << 20, np.float32)
    sub.all_reduce(np.ones(4, np.float32))
    if sub.rank == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    elif sub.rank == late:
        time.sleep(0.8)
    t = time.monotonic()
    try:
        sub.all_reduce(x, algorithm="ring")
        return None
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t
    except commlib.CommError as e:
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t


def silent_peer(comm):
    """Rank 1 does not show up; the others raise PeerError naming it after the timeout; when rank 1
    arrives later its call fails at once instead of hanging."""
    sub = comm.split(0, timeout=2)
    t = time.monotonic()
    x = np.ones(16, np.float32)
    if sub.rank == 1:
        time.sleep(4)
        try:
            sub.all_reduce(x)
            out = ("no error", 0.0)
        except commlib.CommError as e:
            out = (f"{type(e).__name__}: {e}", time.monotonic() - t - 4)
    else:
        try:
            sub.all_reduce(x)
            out = ("no error", 0.0)
        except commlib.PeerError as e:
            out = (str(e), time.monotonic() - t)
    sub.close()
    return out


def _threads():
    return len(os.listdir("/proc/self/task"))


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _maps():
    with open("/proc/self/maps") as f:
        return sum("commlib" in line for line in f)


def resources(comm):
    """Creating, using (async, so the worker thread starts) and closing sub-communicators leaves
    no thread, descriptor or mapping behind."""
    before = (_threads(), _fds(), _maps())
    for _ in range(3):
        sub = comm.split(0)
        half = comm.split(comm.rank % 2)
        works = [sub.all_reduce(np.ones(1000, np.float32), async_op=True) for _ in range(5)]
        works.append(half.all_reduce(np.ones(10, np.int32), async_op=True))
        for w in works:
            w.wait()
        sub.close()
        half.close()
        sub.close()  # idempotent
    after = (_threads(), _fds(), _maps())
    return before, after


def closed_use(comm):
    sub = comm.split(0)
    sub.close()
    try:
        sub.all_reduce(np.ones(3, np.float32))
    except commlib.CommError as e:
        return str(e)
    return None


def split_groups(comm):
    """split by parity with reversed keys: ranks, sizes and a collective on each group."""
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    x = np.array([comm.rank], np.int64)
    sub.all_reduce(x)
    none = comm.split(None if comm.rank == 0 else 1)
    out = (sub.rank, sub.size, int(x[0]), none is None)
    sub.close()
    if none is not None:
        none.close()
    return out
