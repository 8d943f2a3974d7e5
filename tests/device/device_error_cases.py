"""Rank-side scenarios of the stream engine: stream order, works, bad arguments, mismatched calls,
dead and silent peers, leaks. Scenarios that abort a communicator run on a fresh
``comm.split`` so the pool's world communicator stays usable."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

import commlib
import commlib.emulated as emu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine"))
import error_cases as ec  # noqa: E402


def _warm_up(comm):
    """The first device call of a communicator sets up its stream engine, a rendezvous of all
    ranks on the host; the scenarios below need the host free to run host calls in between."""
    x = emu.from_numpy(np.ones(4, np.float32))
    comm.all_reduce(x)
    x.numpy()


def _side_channel(comm):
    """Another communicator of the same ranks, for host barriers that order the ranks around a
    device call: on ``comm`` itself a host call made by one rank while another makes a device
    call is a mismatch (host and device calls share one numbering)."""
    return comm.split(0)


def stream_order(comm):
    """Rank 0's all_reduce returns before its data is ready, and work enqueued after it on the
    same stream sees the result. Deterministic: rank 1 joins the call only after rank 0 checked
    (a host barrier orders them), so rank 0's call cannot have completed before."""
    r = comm.rank
    side = _side_channel(comm)
    _warm_up(comm)
    x = emu.from_numpy(np.full(1000, r + 1, np.float32))
    y = emu.empty(1000, "float32")
    x.numpy()
    if r == 0:
        w = comm.all_reduce(x, algorithm="ring", async_op=True)
        pending = not w.is_completed() and bool((x.host_view_unsynchronized() == 1).all())
        y.copy_(x)  # a later operation on the same stream
        side.barrier()  # host path: lets rank 1 join the device call
        ok = y.numpy().tolist() == [3.0] * 1000
        side.close()
        return pending, ok
    side.barrier()
    comm.all_reduce(x, algorithm="ring")
    side.close()
    return True, x.numpy().tolist() == [3.0] * 1000


def work_wait_orders_another_stream(comm):
    """work.wait(stream=s2) makes s2 wait for the call: a copy enqueued on s2 after it sees the
    result although rank 1 joins late (without the wait, s2 would copy the old data at once)."""
    r = comm.rank
    side = _side_channel(comm)
    _warm_up(comm)
    x = emu.from_numpy(np.full(64, r + 1, np.int32))
    x.numpy()
    s2 = emu.Stream()
    y = emu.empty(64, "int32", stream=s2)
    if r == 0:
        w = comm.all_reduce(x, async_op=True)
        w.wait(stream=s2)
        y.copy_(x, stream=s2)
        side.barrier()
    else:
        side.barrier()
        w = comm.all_reduce(x, async_op=True)
        w.wait(stream=s2)
        y.copy_(x, stream=s2)
    s2.synchronize()
    w.synchronize()
    side.close()
    return y.host_view_unsynchronized().tolist() == [3] * 64 and w.is_completed()


def many_async_calls(comm):
    """Calls enqueued back to back on two streams execute in call order with correct results."""
    P, r = comm.size, comm.rank
    s2 = emu.Stream()
    xs, works = [], []
    for k in range(12):
        s = s2 if k % 2 else emu.current_stream()
        x = emu.from_numpy(np.full(100 + k, r + k, np.int64), stream=s)  # uploaded in s's order
        xs.append(x)
        works.append(comm.all_reduce(x, algorithm=("ring", "direct", "auto")[k % 3], async_op=True, stream=s))
    for w in works:
        w.synchronize()
    return [k for k, x in enumerate(xs) if not (x.host_view_unsynchronized() == sum(q + k for q in range(P))).all()]


def bad_arguments(comm):
    """Every bad call raises, naming the argument, before anything is enqueued: a follow-up
    all_reduce on device buffers is correct."""
    P, r = comm.size, comm.rank
    seen = []
    if r == 0:
        d = emu.empty(8, "float32")
        cases = [
            (lambda: comm.all_reduce(d, out=np.zeros(8, np.float32)), ValueError, "out"),
            (lambda: comm.all_reduce(d, out=emu.empty(9, "float32")), ValueError, "out"),
            (lambda: comm.all_reduce(d, out=emu.empty(8, "int32")), TypeError, "out"),
            (lambda: comm.all_reduce(d, op="band"), ValueError, "op"),
            (lambda: comm.all_reduce(d, algorithm="nope"), ValueError, "algorithm"),
            (lambda: comm.all_reduce(d, stream="s"), TypeError, "stream"),
            (lambda: comm.all_reduce(np.zeros(8, np.float32), stream=emu.Stream()), ValueError, "stream"),
            (lambda: comm.all_gather(emu.empty(8 * P + 1, "float32"), d), ValueError, "output"),
            (lambda: comm.broadcast(d, root=P), ValueError, "root"),
            (lambda: comm.send(d, P), ValueError, "peer"),
            (lambda: comm.send(d, 0), ValueError, "peer"),
            (lambda: comm.batch_p2p([("send", d, 1), ("recv", np.zeros(8, np.float32), 1)]), ValueError, "tensor"),
            (lambda: comm.recv(np.zeros(8, np.float32), 1, stream=emu.Stream()), ValueError, "stream"),
            (lambda: comm.all_to_all(d, d, input_splits=[8] + [0] * (P - 1), output_splits=[8] + [0] * (P - 1)),
             ValueError, "overlaps"),
            (lambda: comm.all_to_all(emu.empty(8, "float32"), d, input_splits=[7] + [1] * (P - 1)), ValueError,
             "input_splits"),
        ]
        seen += ec.check_refused(cases)
    x = emu.from_numpy(np.full(5, r, np.int64))
    comm.all_reduce(x)
    if not (x.numpy() == sum(range(P))).all():
        seen.append(f"follow-up all_reduce wrong: {x.numpy()}")
    return seen


class DeviceCalls:
    """error_cases' call style for commlib.emulated arrays: calls are enqueued (async) and then
    synchronised, so a failure shows on the work."""

    @staticmethod
    def full(n, dtype, value):
        return emu.from_numpy(np.full(n, value, dtype))

    @staticmethod
    def call(fn):
        fn(async_op=True).synchronize()


def mismatch(comm, scenario):
    """error_cases.mismatch on device buffers: every rank's work (or, where the rank's own peers
    matched, its next call) raises MismatchError naming both calls; the communicator is aborted."""
    return ec.mismatch(comm, scenario, DeviceCalls)


def kill_during_collective(comm, victim):
    """``victim`` dies (SIGKILL) while its device all_reduce waits for a late rank; the others'
    works raise PeerError naming it and the call, within the watchdog's checks (not the timeout)."""
    sub = comm.split(0, timeout=60)
    late = min(q for q in range(sub.size) if q != victim)
    x = emu.from_numpy(np.ones(1 << 16, np.float32))
    sub.all_reduce(x)
    x.numpy()
    if sub.rank == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    elif sub.rank == late:
        time.sleep(0.8)
    t = time.monotonic()
    try:
        # The late rank may learn of the death when it enqueues (a failed peer fails the call at
        # once), the others from their works.
        sub.all_reduce(x, algorithm="ring", async_op=True).synchronize()
        if sub.rank == victim:
            time.sleep(5)  # the kill arrives meanwhile
        return None
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t
    except commlib.CommError as e:
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t


def silent_peer(comm):
    """Rank 1 does not show up for 4 s; rank 0's work raises PeerError after the 1.5 s timeout and
    its stream is released (a later numpy() returns)."""
    sub = comm.split(0, timeout=1.5)
    _warm_up(sub)
    x = emu.from_numpy(np.ones(16, np.float32))
    x.numpy()
    t = time.monotonic()
    if sub.rank == 1:
        time.sleep(4)
        try:
            sub.all_reduce(x).__class__
            x.numpy()
            out = ("no error", 0.0)
        except commlib.CommError as e:
            out = (f"{type(e).__name__}: {e}", 0.0)
    else:
        w = sub.all_reduce(x, async_op=True)
        try:
            w.synchronize()
            out = ("no error", 0.0)
        except commlib.PeerError as e:
            out = (str(e), time.monotonic() - t)
        x.numpy()
    sub.close()
    return out


def _threads():
    return len(os.listdir("/proc/self/task"))


def _fds():
    return len(os.listdir("/proc/self/fd"))


def resources(comm):
    """Sub-communicators that ran device collectives (engines, imports, inboxes) leave no thread,
    descriptor or device memory behind once closed."""
    dev = emu.device()
    x = emu.from_numpy(np.ones(1000, np.float32))
    x.numpy()
    before = (_threads(), _fds(), dev.allocated_bytes())
    for _ in range(3):
        sub = comm.split(0)
        works = [sub.all_reduce(x, async_op=True) for _ in range(3)]
        works[-1].synchronize()
        sub.close()
        sub.close()  # idempotent
    emu.synchronize()
    return before, (_threads(), _fds(), dev.allocated_bytes())
