"""Rank side of test_call_structure.py (apart from the test module, so that the ranks import
neither pytest nor the test modules): the driver calls one device all_reduce makes, counted by the
emulated device, and the route's cache of resolved calls (issue #25, the host cost of a call)."""
import numpy as np

import commlib.emulated as emu
from kernel_path_cases import COPY_SETTINGS, KERNEL_SETTINGS, counted, per_path, with_settings

# The driver calls a call's structure is pinned by (device/emulated/emulated_device.cc's names).
WATCHED = ("the kernel path's launch", "cudaEventRecord", "cudaStreamWaitEvent", "cudaLaunchHostFunc",
           "cudaMemcpyAsync", "cuStreamWriteValue64", "cuStreamWaitValue64")


def _watched_calls():
    return {k: v for k, v in emu.device().driver_calls().items() if k in WATCHED}


def driver_calls_per_call(comm, n=10):
    """Per path (kernel, copy): (driver calls of n in-place all_reduces of one buffer on the current
    stream after a warm-up call, the path they took, all results right)."""
    def run(sub):
        x = emu.from_numpy(np.zeros(5, np.int32))
        sub.all_reduce(x, op="max", algorithm="ring")  # set-up, plan upload: not per call
        emu.current_stream().synchronize()
        calls, _ = counted(_watched_calls, lambda: [sub.all_reduce(x, op="max", algorithm="ring") for _ in range(n)])
        ok = bool((x.numpy() == 0).all())
        y = emu.from_numpy(np.full(5, sub.rank + 1, np.int32))
        sub.all_reduce(y, op="max", algorithm="ring")
        ok &= bool((y.numpy() == sub.size).all())
        return calls, sub._device().last_path(), ok
    return per_path(comm, run)


def calls_on_alternating_streams(comm, n=6):
    """(driver calls of n kernel-path calls alternating between two streams, results right): each
    call waits for the previous one, which ran on the other stream (call order across streams).
    Streams are non-blocking (cudaStreamNonBlocking, as torch's side streams): nothing orders the
    calls after the current stream's work, so x is uploaded on the first call's stream. The current
    stream is held at a gate until the calls completed, so that an upload there (as this case once
    made: a race, seen under CPU load) is read after them, every time."""
    def run(sub):
        dev = emu.device()
        # Made one after another: three hardware queues (COMMLIB_EMULATED_CONNECTIONS, 8), so the
        # held stream's wait holds up neither of the others.
        streams, held = [emu.Stream(), emu.Stream()], emu.Stream()
        gate = np.zeros(1, np.uint64)
        dev.wait_value(gate.ctypes.data, 1, held._stream)
        try:
            with emu.use_stream(held):
                x = emu.from_numpy(np.ones(5, np.int64), stream=streams[1])
                sub.all_reduce(x, stream=streams[1])
                calls, _ = counted(_watched_calls,
                                   lambda: [sub.all_reduce(x, stream=streams[i % 2]) for i in range(n)])
                streams[(n - 1) % 2].synchronize()
        finally:
            dev.write_value(gate.ctypes.data, 1, streams[0]._stream)  # the held stream goes on
        return calls, bool((x.numpy() == sub.size ** (n + 1)).all())
    return with_settings(comm, KERNEL_SETTINGS, run)


def enqueue_beside_a_held_query(comm):
    """A call enqueued while the watchdog sits in an event query (held by the emulated device's
    gate, as a cudaEventQuery behind a busy driver lock): (the query still held when the call
    returned, results right). The enqueue must not wait for the engine's mutex behind the query."""
    import time

    import commlib._C as _C

    def run(sub):
        x = emu.from_numpy(np.ones(4, np.int64))
        sub.all_reduce(x)
        emu.current_stream().synchronize()
        _C.emulated_hold_queries(True)  # this thread's queries pass; the watchdog's wait
        try:
            sub.all_reduce(x)  # in flight: the watchdog queries its event on its next tick
            deadline = time.monotonic() + 3
            while _C.emulated_queries_held() == 0 and time.monotonic() < deadline:
                time.sleep(0.002)
            entered = _C.emulated_queries_held() > 0
            sub.all_reduce(x)  # begin(): the engine's mutex, which the old watchdog held while querying
            held_during_call = entered and _C.emulated_queries_held() > 0
        finally:
            _C.emulated_hold_queries(False)
        emu.current_stream().synchronize()
        return held_during_call, bool((x.numpy() == sub.size ** 3).all())
    return with_settings(comm, COPY_SETTINGS, run)
