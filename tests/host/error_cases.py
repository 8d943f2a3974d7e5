"""Rank-side error scenarios, one matrix for the host route and the device route (the stream
engine on commlib.emulated arrays): bad arguments, mismatched calls, dead and silent peers, leaks.
Each scenario takes the route's name (error_routes.py holds what each route has of its own). Each
one that aborts a communicator does it on a fresh sub-communicator from ``comm.split`` so the
pool's world communicator stays usable."""
from __future__ import annotations

import time

import numpy as np

import commlib
from commlib.testing.faults import arm_death, mark_reached, wait_until_reached
from error_routes import fds, route, threads


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


def bad_arguments(comm, route_name="host"):
    """Rank 0 makes every bad call (those of both routes, then the route's own); none may send or
    enqueue anything, which the final all_reduce proves (a stray message would show up there as a
    MismatchError)."""
    rt = route(route_name)
    P, r = comm.size, comm.rank
    seen = []
    if r == 0:
        def full(n, dtype="float32"):
            return rt.full(n, dtype, 0)
        f32 = full(8)
        cases = [
            (lambda: comm.all_reduce(f32, out=full(8, "float64")), TypeError, "out"),
            (lambda: comm.all_reduce(f32, out=full(8, "int32")), TypeError, "out"),
            (lambda: comm.all_reduce(f32, out=full(9)), ValueError, "out"),
            (lambda: comm.all_reduce(f32, algorithm="nope"), ValueError, "algorithm"),
            (lambda: comm.all_reduce(f32, op="band"), ValueError, "op"),
            (lambda: comm.all_reduce(f32, op="mean"), ValueError, "op"),
            (lambda: comm.all_reduce(f32, op="premul_sum"), ValueError, "scale"),
            (lambda: comm.all_reduce(f32, scale=2.0), ValueError, "scale"),
            (lambda: comm.all_gather(full(8 * P + 1), f32), ValueError, "output"),
            (lambda: comm.all_gather(full(8 * P, "int32"), f32), TypeError, "output"),
            (lambda: comm.reduce_scatter(f32, full(8 * P + 2)), ValueError, "input"),
            (lambda: comm.all_to_all(full(8), full(7)), ValueError, "output"),
            (lambda: comm.all_to_all(f32, full(8), input_splits=[8] + [0] * (P - 1), output_splits=[1] * P),
             ValueError, "splits"),
            (lambda: comm.all_to_all(full(8), f32, input_splits=[7] + [1] * (P - 1)), ValueError, "input_splits"),
            (lambda: comm.broadcast(f32, root=P), ValueError, "root"),
            (lambda: comm.broadcast(f32, root=-1), ValueError, "root"),
            (lambda: comm.reduce(f32, root=P + 3), ValueError, "root"),
            (lambda: comm.gather(None, f32, root=0), ValueError, "output"),
            (lambda: comm.scatter(f32, None, root=0), ValueError, "input"),
            (lambda: comm.send(f32, P), ValueError, "peer"),
            (lambda: comm.send(f32, 0), ValueError, "peer"),
            (lambda: comm.recv(f32, -1), ValueError, "peer"),
            (lambda: comm.batch_p2p([("put", f32, 1 % P)]), ValueError, "ops"),
            (lambda: comm.split(-2), ValueError, "color"),
        ] + rt.own_bad_arguments(comm, f32)
        seen += check_refused(cases)
    x = rt.full(5, "int64", r)
    comm.all_reduce(x)
    got = rt.read(x)
    if not (got == sum(range(P))).all():
        seen.append(f"follow-up all_reduce wrong: {got}")
    return seen


def mismatch(comm, scenario, route_name="host"):
    """Ranks call different things on a fresh sub-communicator; every rank must get a
    MismatchError (from the call or, for a rank whose part needed nothing back, the next call)
    naming both calls, within seconds; the sub-communicator is aborted."""
    calls = route(route_name)
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
    elif scenario in ("codec", "codec_vs_none"):  # compress= is part of the call descriptor
        other = "int4" if scenario == "codec" else None
        call = lambda **kw: sub.all_reduce(x, algorithm="ring", compress="int8" if r == 0 else other, **kw)  # noqa: E731
        names = ("compress=int8", "different compress=") + (("compress=int4",) if other else ())
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


def kill_during_collective(comm, victim, route_name="host"):
    """``victim`` dies (SIGKILL) inside an all_reduce; the others must raise PeerError naming it,
    the collective and its sequence number (on the device route: from their works, through the
    watchdog's checks, not the timeout).

    To be sure the victim is inside the call when it dies, one other rank ("late") joins the call
    only after the kill: the victim is then blocked waiting for that rank's data. The remaining
    ranks are inside the call when the victim dies; the late one starts after it (and may learn
    of the death when it makes the call: a failed peer fails the call at once).
    """
    rt = route(route_name)
    sub = comm.split(0, timeout=rt.KILL_TIMEOUT)
    x = rt.full(rt.KILL_COUNT, "float32", 1)
    sub.all_reduce(x)
    rt.read(x)
    arm_death(sub, victim)
    t = time.monotonic()
    try:
        rt.call(lambda **kw: sub.all_reduce(x, algorithm="ring", **kw))
        if sub.rank == victim:
            time.sleep(5)  # the kill arrives meanwhile
        return None
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t
    except commlib.CommError as e:
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t


def silent_peer(comm, route_name="host"):
    """Rank 1 does not show up until the others gave up; they raise PeerError naming it after the
    route's timeout, and their buffers are usable again (on the device route: the stream is
    released); when rank 1 arrives later (once every other rank closed its communicator) its call
    fails at once instead of hanging. Returns (message, seconds the failing call took)."""
    rt = route(route_name)
    sub = comm.split(0, timeout=rt.SILENT_TIMEOUT)
    rt.warm_up(sub)
    x = rt.full(16, "float32", 1)
    rt.read(x)
    t = time.monotonic()
    if sub.rank == 1:
        wait_until_reached(sub, "gave-up", [q for q in range(sub.size) if q != 1])
        t = time.monotonic()
        try:
            rt.call(lambda **kw: sub.all_reduce(x, **kw))
            rt.read(x)
            out = ("no error", 0.0)
        except commlib.CommError as e:
            out = (f"{type(e).__name__}: {e}", time.monotonic() - t)
    else:
        try:
            rt.call(lambda **kw: sub.all_reduce(x, **kw))
            out = ("no error", 0.0)
        except commlib.PeerError as e:
            out = (str(e), time.monotonic() - t)
        rt.read(x)  # returns: the buffer is usable again (the device route: its stream was released)
    sub.close()
    if sub.rank != 1:
        mark_reached(sub, "gave-up")
    return out


def _wait_chain(rank, size, count, root):
    """An all_reduce-shaped schedule of 3 ranks that is only a chain of waits: rank 2 receives from
    rank 0, which first receives from rank 1, then sends to rank 2 (silent_peer_late_waiter)."""
    whole = ("output", 0, count)
    if rank == 0:
        return [[{"op": "recv", "peer": 1, "dst": whole}], [{"op": "send", "peer": 2, "src": whole}]]
    if rank == 1:
        return [[{"op": "send", "peer": 0, "src": ("input", 0, count)}]]
    return [[{"op": "recv", "peer": 0, "dst": whole}]]


def silent_peer_late_waiter(comm, late_s=0.6):
    """Rank 1 silent; rank 2 waits on rank 0 from the start of its call, and rank 0, coming `late_s`
    later, waits on rank 1 (_wait_chain): rank 2's clock runs out first, on a rank that is in the
    call and waiting itself, which must not be blamed: every waiting rank's error names rank 1.
    Returns (message, seconds) per rank (rank 1: ("", 0.0))."""
    commlib.register_algorithm("all_reduce", "wait_chain", _wait_chain)
    try:
        sub = comm.split(0, timeout=2.0)
        x = np.ones(16, np.float32)
        out = ("", 0.0)
        if sub.rank != 1:
            if sub.rank == 0:
                time.sleep(late_s)
            t = time.monotonic()
            try:
                sub.all_reduce(x, algorithm="wait_chain")
                out = ("no error", 0.0)
            except commlib.PeerError as e:
                out = (str(e), time.monotonic() - t)
            mark_reached(sub, "gave-up-late")
        else:
            wait_until_reached(sub, "gave-up-late", [0, 2])
        sub.close()
    finally:
        commlib.unregister_algorithm("all_reduce", "wait_chain")
    return out


def resources(comm, route_name="host"):
    """Creating, using (async, so the worker thread and, on the device route, the engine start)
    and closing sub-communicators leaves no thread, descriptor, mapping or device memory behind."""
    rt = route(route_name)
    xs = [rt.full(1000, "float32", 1) for _ in range(5)]
    y = rt.full(10, "int32", 1)
    rt.read(y)
    before = None
    for k in range(4):
        # Counted from after the first round: what the first communicators create once per process
        # (one thread, descriptor and mapping per group shape on the device route since the peer
        # buffers and launch chain landed) is not a leak; anything per communicator is.
        if k == 1:
            rt.settle()
            before = (threads(), fds(), rt.held())
        sub = comm.split(0)
        half = comm.split(comm.rank % 2)
        works = [sub.all_reduce(x, async_op=True) for x in xs]
        works.append(half.all_reduce(y, async_op=True))
        for w in works:
            rt.wait(w)
        sub.close()
        half.close()
        sub.close()  # idempotent
    rt.settle()
    return before, (threads(), fds(), rt.held())


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
