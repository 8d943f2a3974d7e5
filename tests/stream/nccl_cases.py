"""Rank-side cases of the NCCL tests (test_nccl.py): the collective matrix is device_cases'
(this module only adds the failure cases), on the emulated device whose NCCL is the emulated one
(csrc/device/emulated/nccl_emulated.h)."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

import commlib
import commlib.emulated as emu

from kernel_path_cases import with_settings


def links(comm):
    """Which peers this rank's device engine reaches over NCCL (after a device call)."""
    x = emu.from_numpy(np.ones(4, np.float32))
    comm.all_reduce(x)
    x.numpy()
    engine = next(iter(comm._device()._engines.values()))
    return engine.nccl_carries_any(), engine.nccl_ready()


def link_names(comm):
    """This rank's device link to every rank as its engine chose it ("ipc", "nccl", "" for
    itself; csrc/stream/device_link.h), after a device call."""
    x = emu.from_numpy(np.ones(4, np.float32))
    comm.all_reduce(x)
    x.numpy()
    return next(iter(comm._device()._engines.values())).links()


def forced_links(comm, setting):
    """On a split whose engine is made with COMMLIB_DEVICE_LINK=``setting`` (read when the first
    device call creates it): (links, peers mapped, NCCL carries some peer, NCCL communicator
    created, an all_reduce and a ring all_gather on that engine gave the right results)."""
    os.environ["COMMLIB_DEVICE_LINK"] = setting
    sub = comm.split(0, timeout=30)
    try:
        x = emu.from_numpy(np.full(1000, sub.rank + 1, np.int32))
        sub.all_reduce(x)
        del os.environ["COMMLIB_DEVICE_LINK"]
        g = emu.empty(3 * sub.size, "int32")
        sub.all_gather(g, emu.from_numpy(np.full(3, sub.rank, np.int32)), algorithm="ring")
        right = (np.array_equal(x.numpy(), np.full(1000, sub.size * (sub.size + 1) // 2, np.int32))
                 and np.array_equal(g.numpy(), np.repeat(np.arange(sub.size, dtype=np.int32), 3)))
        engine = next(iter(sub._device()._engines.values()))
        return engine.links(), engine.mapped_peers(), engine.nccl_carries_any(), engine.nccl_ready(), right
    finally:
        os.environ.pop("COMMLIB_DEVICE_LINK", None)
        sub.close()


def disagreeing_link_settings(comm):
    """Rank 0's engine reads COMMLIB_DEVICE_LINK=nccl, the others' auto: the first device call
    raises MismatchError naming the setting on every rank (the store agreement, before any link
    is chosen). Returns (error type, message)."""
    if comm.rank == 0:
        os.environ["COMMLIB_DEVICE_LINK"] = "nccl"
    sub = comm.split(0, timeout=30)
    try:
        sub.all_reduce(emu.from_numpy(np.ones(4, np.float32)))
        return None
    except Exception as e:  # noqa: BLE001 - the type is what the test checks
        return type(e).__name__, str(e)
    finally:
        os.environ.pop("COMMLIB_DEVICE_LINK", None)
        sub.close()


def _released():
    """An operation enqueued on the current stream after a failed call completes."""
    y = emu.from_numpy(np.full(8, 3, np.float32))
    return y.numpy().tolist() == [3.0] * 8


def _expect(expected, run, since, check_release=False):
    """The tail the failure cases share, in the (message, seconds) shape the tests and
    commlib.testing.faults read: runs ``run()`` and returns the message of the ``expected`` error
    it raised (None if it raised nothing; "wrong type <T>: ..." for another CommError, which the
    tests refuse; "stream not released: ..." when ``check_release`` and an operation enqueued
    after the failure does not complete) and the seconds since ``since``."""
    try:
        run()
        return None, time.monotonic() - since
    except expected as e:
        took = time.monotonic() - since
        return (str(e) if not check_release or _released() else "stream not released: " + str(e)), took
    except commlib.CommError as e:
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - since


def mismatch(comm, scenario):
    """Ranks 0 and 1 make different NCCL calls: each raises MismatchError naming both sides.
    ``first``: the first algorithm="nccl" call differs (caught on the host before NCCL is set
    up); ``later``: after a matched one, rank 0 calls algorithm="nccl" and rank 1 "ring" (caught
    by the engine's descriptor check before anything is enqueued in NCCL)."""
    sub = comm.split(0, timeout=30)
    r = sub.rank
    x = emu.from_numpy(np.ones(64 + (r == 1 and scenario == "first"), np.float32))

    def run():
        if scenario == "later":
            sub.all_reduce(x, algorithm="nccl")
            x.numpy()
        sub.all_reduce(x, algorithm="nccl" if (r == 0 or scenario == "first") else "ring", async_op=True).synchronize()
        sub.all_reduce(x, async_op=True).synchronize()
    out = _expect(commlib.MismatchError, run, time.monotonic())
    sub.close()
    return out


def kill_during_nccl(comm, victim, algorithm):
    """``victim`` dies (SIGKILL) while the others' streams are blocked in an NCCL group (the
    emulated NCCL's) waiting for it: their works raise PeerError naming it, through the watchdog
    and ncclCommAbort, and their streams run on. The victim's data operations are slow
    (COMMLIB_EMULATED_DELAY_US is 0.2 s on it, test_nccl.py), its synchronisation is not: it
    passes the call's descriptor check at once, then sits in a delayed copy or reduction before
    its own NCCL group while the others already wait in theirs, and dies there."""
    sub = comm.split(0, timeout=60)
    x = emu.from_numpy(np.ones(1 << 12, np.float32))
    sub.all_reduce(x, algorithm=algorithm)
    x.numpy()
    sub.barrier()
    if sub.rank == victim:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGKILL)).start()

    def run():
        sub.all_reduce(x, algorithm=algorithm, async_op=True).synchronize()
        if sub.rank == victim:
            time.sleep(5)
    msg, took = _expect(commlib.PeerError, run, time.monotonic(), check_release=True)
    return None if msg is None else (msg, took)


def host_buffers_refused(comm):
    """algorithm="nccl" on host buffers is refused before anything is sent."""
    try:
        comm.all_reduce(np.ones(4, np.float32), algorithm="nccl")
    except ValueError as e:
        return str(e)
    return None


def band_refused(comm):
    x = emu.from_numpy(np.ones(4, np.int32))
    try:
        comm.all_reduce(x, op="band", algorithm="nccl")
    except ValueError as e:
        return str(e)
    return None


def kill_during_nccl_algorithm(comm, victim):
    return kill_during_nccl(comm, victim, "nccl")


def kill_during_nccl_link(comm, victim):
    return kill_during_nccl(comm, victim, "ring")


def resources(comm):
    """Sub-communicators that created NCCL communicators (the emulated NCCL: memfd regions, the
    unique id's rendezvous) and ran calls over them leave no thread, descriptor or device memory
    behind once closed."""
    dev = emu.device()
    x = emu.from_numpy(np.ones(100_000, np.float32))
    x.numpy()

    def counts():
        return (len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")), dev.allocated_bytes())
    before = counts()
    for _ in range(3):
        sub = comm.split(0)
        sub.all_reduce(x, algorithm="nccl")
        sub.all_reduce(x, algorithm="ring", async_op=True).synchronize()
        sub.close()
    emu.synchronize()
    return before, counts()


def async_error(comm, injector):
    """The ranks make an algorithm="nccl" all_reduce; the last one joins 1.5 s late, so the others
    are blocked inside NCCL when ``injector``'s emulated NCCL reports an asynchronous error
    (ncclSystemError, as NCCL does when its threads find a network failure). Every rank raises
    CommError naming NCCL's error and the call within seconds (the injector's watchdog polls
    ncclCommGetAsyncError, fails and aborts; the others hear of it on the control plane), and the
    streams are released. Returns (error type, message, seconds, released) per rank."""
    sub = comm.split(0, timeout=30)
    x = emu.from_numpy(np.ones(1 << 10, np.float32))
    sub.all_reduce(x, algorithm="nccl")
    x.numpy()
    engine = next(iter(sub._device()._engines.values()))
    if sub.rank == sub.size - 1:
        time.sleep(1.5)
    t = time.monotonic()
    try:
        work = sub.all_reduce(x, algorithm="nccl", async_op=True)
        if sub.rank == injector:
            engine.nccl_inject_async_error(2)
        work.synchronize()
        out = None
    except commlib.CommError as e:
        out = (type(e).__name__, str(e), time.monotonic() - t, _released())
    sub.close()
    return out


def silent_inside_nccl(comm):
    """Rank 1's data operations are slow (COMMLIB_EMULATED_DELAY_US 3 s on it, test_nccl_errors.py),
    its synchronisation is not: in an algorithm="nccl" all_reduce with premul_sum it passes the
    descriptor check at once and then sits in the scaling copy before ncclAllReduce, while rank 0
    already waits inside it (6 s: two slow operations). Rank 0's work raises PeerError after the
    2.5 s timeout (room for the set-up's host steps under load) saying it
    waited inside NCCL (the call and its peers), not for its peers to join. Rank 1 only enqueues
    and returns (its pool is killed after: its slow stream would take seconds to drain)."""
    sub = comm.split(0, timeout=2.5)
    x = emu.from_numpy(np.ones(64, np.float32))
    x.numpy()
    comm.barrier()  # host waits on the pool's communicator: rank 1's upload takes 3 s
    # The first NCCL call (its communicator is created on the host first): no earlier call whose
    # slow operations on rank 1 would keep rank 0 inside NCCL past the timeout.
    t = time.monotonic()
    work = sub.all_reduce(x, op="premul_sum", scale=2.0, algorithm="nccl", async_op=True)
    if sub.rank == 1:
        return None
    try:
        work.synchronize()
        out = None
    except commlib.CommError as e:
        out = (type(e).__name__, str(e), time.monotonic() - t)
    sub.close()
    return out


def two_ranks_on_one_device(comm):
    """Every rank on emulated:0 (several ranks per device): algorithm="nccl" is refused by name
    before ncclCommInitRank; the emulated NCCL's own ncclCommInitRank refuses it too, as NCCL
    does ("Duplicate GPU detected"). Returns (commlib's error, the emulated NCCL's error)."""
    from commlib.bootstrap.wait import wait_for_key
    from commlib.device import nccl
    sub = comm.split(0, device="emulated:0")
    x = emu.from_numpy(np.ones(8, np.float32), 0)
    try:
        sub.all_reduce(x, algorithm="nccl")
        ours = None
    except commlib.CommError as e:
        ours = str(e)
    engine = sub._device_route._engines[("emulated", 0)]
    engine.nccl_load(nccl.candidates())
    if comm.rank == 0:
        comm._store.set("dup-gpu/id", bytes(engine.nccl_unique_id()))
    uid = wait_for_key(comm._store, "dup-gpu/id", time.monotonic() + 20,
                       on_timeout=lambda: TimeoutError("rank 0's unique id"))
    try:
        engine.nccl_init(uid)
        theirs = None
    except Exception as e:  # noqa: BLE001 (whatever the binding raises for NCCL's error)
        theirs = str(e)
    comm.barrier()
    sub.close()
    return ours, theirs


def nccl_calls_run_from_cpp(comm):
    """algorithm="nccl" through the Python communicator's C++ entry: the first such call takes the
    Python route (it makes NCCL's communicator through the store); after it, the same call again
    (kept by the route) and new shapes (a fresh buffer, an all_gather) run from C++, exactly; a
    bitwise op, which NCCL lacks, is still the route's ValueError naming `op`, with nothing run.
    Returns ([C++ hits of each step], [new shapes of each step], the error, results right)."""
    import commlib._C as _C
    sub = comm.split(0, timeout=30)
    P, r = sub.size, sub.rank
    hits, new, right = [], [], True

    def counted(fn):
        h0, n0 = _C.device_fast_path_counts()[1], _C.device_fast_path_new_shape_count()
        fn()
        emu.current_stream().synchronize()
        hits.append(_C.device_fast_path_counts()[1] - h0)
        new.append(_C.device_fast_path_new_shape_count() - n0)
    try:
        x = emu.from_numpy(np.full(64, r + 1, np.float32))
        counted(lambda: sub.all_reduce(x, algorithm="nccl"))  # the communicator: the Python route
        counted(lambda: sub.all_reduce(x, algorithm="nccl"))  # kept: a hit
        y = emu.from_numpy(np.full(13, r + 1, np.int32))
        counted(lambda: sub.all_reduce(y, op="max", algorithm="nccl"))  # a new shape
        g = emu.empty(5 * P, "int64")
        counted(lambda: sub.all_gather(g, emu.from_numpy(np.full(5, r, np.int64)), algorithm="nccl"))
        error = None
        try:
            counted(lambda: sub.all_reduce(y, op="band", algorithm="nccl"))
        except ValueError as e:
            error = str(e)
            hits.append(None)
        S = P * (P + 1) // 2
        right = (np.array_equal(x.numpy(), np.full(64, S * P, np.float32))
                 and np.array_equal(y.numpy(), np.full(13, P, np.int32))
                 and np.array_equal(g.numpy(), np.repeat(np.arange(P, dtype=np.int64), 5)))
    finally:
        sub.close()
    return hits, new, error, right


def grouped_sends_in_order(comm, segment, pause_ms):
    """rail_window's all_reduce of 1031 int32 with a pipeline segment of `segment` across two hosts
    (test_nccl.py's TWO_HOSTS): its device list merges the lanes' rounds, so a step's NCCL group
    holds 128 messages to the rank's peer on the other host, more than the emulated NCCL's 4 slots
    per pair. On rank 0 the group's sweep that first holds a send back pauses `pause_ms` after it
    and at its end (emulated_nccl_pause_sweep): the peer frees slots meanwhile, then reads what the
    sweep published. The chunks must still move in order per pair (a later send passing the held
    one would count a chunk never written, and the peer would read a stale slot). Returns (pauses
    rank 0's NCCL made, whether the sum is exact) per rank."""
    def run(sub):
        P, r, n = sub.size, sub.rank, 1031
        def values(q):
            return ((np.arange(n, dtype=np.int64) * 7919 + q * 104729) % 1000003).astype(np.int32)
        x = emu.from_numpy(values(r))
        sub.all_reduce(x, algorithm="rail_window")  # the NCCL communicator exists from here on
        x.numpy()
        engine = next(iter(sub._device()._engines.values()))
        if r == 0:
            engine.nccl_pause_sweep(pause_ms)
        y = emu.from_numpy(values(r))
        sub.all_reduce(y, algorithm="rail_window")
        right = np.array_equal(y.numpy(), sum(values(q).astype(np.int64) for q in range(P)).astype(np.int32))
        return engine.nccl_pause_sweep(0) if r == 0 else None, right
    return with_settings(comm, {"COMMLIB_HIER_SEGMENT": str(segment)}, run)
