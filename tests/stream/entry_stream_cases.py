"""Rank side of test_entry_streams.py: device calls on a stream the caller names, as ``stream=`` or
as a ``__cuda_array_interface__``'s own ``stream`` (version 3), through the C++ entry
(csrc/bindings/named_stream.cc, foreign_arrays.cc, device_call_new_shape.cc), with a spy on the
Python route (DeviceRoute.run) counting what it still sees."""
import contextlib

import numpy as np

import commlib._C as _C
import commlib.emulated as emu
from commlib.core import device_route
from fast_device_call_cases import collective_calls
from foreign_arrays import CudaArrayView
from kernel_path_cases import KERNEL_SETTINGS, with_settings


@contextlib.contextmanager
def route_spy():
    """Counts DeviceRoute.run's calls (the Python route of a device collective) inside the block:
    yields a list the spy appends each call's collective to."""
    seen = []
    real = device_route.DeviceRoute.run

    def spy(self, coll, *args, **kw):
        seen.append(coll)
        return real(self, coll, *args, **kw)
    device_route.DeviceRoute.run = spy
    try:
        yield seen
    finally:
        device_route.DeviceRoute.run = real


def same_stream(s):
    """A new Python object naming emulated stream ``s`` (as torch.cuda.current_stream() returns a new
    torch.cuda.Stream object of the same cudaStream_t at every call): the entry keys a call on the
    stream, not on the object that names it."""
    t = emu.Stream.__new__(emu.Stream)
    t.device_index, t._device, t._stream = s.device_index, s._device, s._stream
    return t


def _own_stream(stream):
    """A caller's view of each array as another library's, naming ``stream`` as the one its data is
    valid on (__cuda_array_interface__ version 3's "stream": an emulated stream's handle)."""
    return lambda a: CudaArrayView(a, stream=stream.handle)


def named_and_own_stream_calls(comm, k=2):
    """After one all_reduce set the engine up (the Python route's), every collective (all_reduce,
    all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter) on a stream the
    caller names, ``stream=`` (a stream no call ran on, named by a new object at every call) and a
    __cuda_array_interface__'s own ``stream``, each blocking and async, k + 1 times (the first a new
    shape): {case: (the Python
    route's calls, C++ entry hits, calls made, async works' wait() resolved to the call's stream,
    results right)}."""
    def run(sub):
        warm = emu.from_numpy(np.ones(2, np.float32))
        sub.all_reduce(warm)  # the engine's set-up: the Python route's
        emu.current_stream().synchronize()
        out = {}
        for case in ("stream=", "interface's stream"):
            s = emu.Stream()
            wrap = _own_stream(s) if case != "stream=" else None
            named = (lambda: same_stream(s)) if case == "stream=" else (lambda: None)
            calls = collective_calls(sub, wrap=wrap)
            s.wait_event(emu.current_stream().record_event())  # the arrays' uploads
            made, waits_ok = 0, True
            hits = _C.device_fast_path_counts()[1]
            with route_spy() as seen:
                for name, (call, _) in calls.items():
                    for async_op in (False, True):
                        for _ in range(k + 1):
                            w = call(async_op, named())
                            made += 1
                            if async_op:
                                # wait(stream=None) orders the call's stream (the route's resolver of
                                # that buffer); a named stream= call's work: the current one.
                                want = s.handle if case != "stream=" else _C.stream_identity(emu.current_stream()._stream)
                                waits_ok &= _C.stream_identity(w._stream_of(None)) == want
            hits = _C.device_fast_path_counts()[1] - hits
            s.synchronize()
            right = all(bool(check()) for _, check in calls.values())
            out[case] = (len(seen), hits, made, waits_ok, right)
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def interface_stream_orders_the_call(comm, count=4096):
    """A __cuda_array_interface__'s stream is where its data is valid: the buffer is written by a
    copy enqueued on that stream (slow under the emulated delay) and passed at once, with no
    synchronization by the caller; the call (a new shape, and then a hit) must run after the copy.
    (results right for the new shape and the hit, the Python route's calls)."""
    def run(sub):
        P, r = sub.size, sub.rank
        warm = emu.from_numpy(np.ones(2, np.float32))
        sub.all_reduce(warm)  # the engine's set-up
        emu.current_stream().synchronize()
        s = emu.Stream()
        x = emu.from_numpy(np.zeros(count, np.float32))
        rights = []
        with route_spy() as seen:
            for step in range(2):
                src = emu.from_numpy(np.full(count, (r + 1) * (step + 1), np.float32))
                emu.current_stream().synchronize()  # x and src uploaded; s knows nothing of the default stream
                x.copy_(src, stream=s)
                sub.all_reduce(CudaArrayView(x, stream=s.handle))
                s.synchronize()
                rights.append(bool((x.host_view_unsynchronized() == (step + 1) * P * (P + 1) / 2).all()))
        return rights, len(seen)
    return with_settings(comm, KERNEL_SETTINGS, run)


def wrong_stream_types(comm):
    """After hits of the same call, stream= of a type the route's resolver refuses: (the error, the
    Python route's calls, the emulated device's driver calls on this thread while it raised)."""
    def run(sub):
        x = emu.from_numpy(np.ones(4, np.float32))
        for _ in range(3):
            sub.all_reduce(x, op="max")
        emu.current_stream().synchronize()
        out = []
        for bad in ("s", 7, emu.current_stream()._stream):
            before = _C.emulated_thread_driver_calls()
            with route_spy() as seen:
                try:
                    sub.all_reduce(x, op="max", stream=bad)
                    error = None
                except TypeError as e:
                    error = str(e)
            after = _C.emulated_thread_driver_calls()
            calls = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            out.append((type(bad).__name__, error, len(seen), calls))
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def steady_named_stream_counts(comm, on, n):
    """all_reduce and all_gather on the kernel path, on a stream the caller names (``on``: "named",
    stream=, a new object naming it at every call; "own", a __cuda_array_interface__ view of each
    array naming it; "both", such views naming one stream and the calls on another, stream=): {(collective, "blocking"|"async"): (driver calls of n steady calls, hits,
    results right and the async works' wait() resolved to the call's stream, path, C++ heap
    allocations)}, counted as test_call_counts.py's steady calls are (after three drained warm-up
    calls and 2 * KEPT held ones, the caller holding its last KEPT works)."""
    import collections

    from call_count_cases import KEPT, _counted, _drain
    from foreign_array_cases import _once

    def run(sub):
        s = emu.Stream()
        t = emu.Stream() if on == "both" else s  # (the calls' stream)
        calls = collective_calls(sub, wrap=_once(_own_stream(s)) if on in ("own", "both") else None)
        named = (lambda: same_stream(t)) if on in ("named", "both") else (lambda: None)
        want = _C.stream_identity(emu.current_stream()._stream) if on == "named" else s.handle
        s.wait_event(emu.current_stream().record_event())  # the arrays' uploads
        t.wait_event(emu.current_stream().record_event())
        out = {}
        for name in ("all_reduce", "all_gather"):
            call, check = calls[name]
            for mode in ("blocking", "async"):
                a = mode == "async"
                for _ in range(3):
                    _drain([call(a, named())])
                    s.synchronize()
                    t.synchronize()
                held = collections.deque(maxlen=KEPT)

                def issue(k):
                    for _ in range(k):
                        held.append(call(a, named()))
                issue(2 * KEPT)
                counted, hits, _, allocs = _counted(lambda: issue(n))
                waits = all(_C.stream_identity(w._stream_of(None)) == want for w in held if w is not None)
                _drain(held)
                s.synchronize()
                t.synchronize()
                held.clear()
                out[(name, mode)] = (counted, hits, bool(check()) and waits, sub._device().last_path(), allocs)
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


class _TorchInterface:
    """A torch CUDA tensor seen only through __cuda_array_interface__ (version 3) naming `stream`
    (a cudaStream_t), as a CuPy array made on that stream describes itself."""

    def __init__(self, t, stream):
        self.t = t  # keeps the memory alive
        self.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "<f4", "data": (t.data_ptr(), False),
                                         "version": 3, "stream": stream}


def cuda_named_and_own_streams(comm, k=2):
    """On GPU 0 with torch (test_cuda_ranks.py, never run so far): after one all_reduce set the
    engine up, all_reduce on a side stream named as a torch.cuda.ExternalStream made anew each call,
    as its int cudaStream_t, and by a __cuda_array_interface__ view naming it, blocking and async,
    k + 1 calls each: (the Python route's calls, C++ entry hits, results right)."""
    import torch
    torch.cuda.set_device(0)
    P = comm.size
    comm.all_reduce(torch.ones(2, device="cuda"))  # the engine's set-up
    s = torch.cuda.Stream()
    x = torch.full((64,), float(comm.rank + 1), device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    spellings = {"ExternalStream": (lambda: torch.cuda.ExternalStream(s.cuda_stream), lambda t: t),
                 "int": (lambda: s.cuda_stream, lambda t: t),
                 "interface": (lambda: None, lambda t: _TorchInterface(t, s.cuda_stream))}
    hits, calls = _C.device_fast_path_counts()[1], 0
    with route_spy() as seen:
        for named, view in spellings.values():
            for async_op in (False, True):
                for _ in range(k + 1):
                    w = comm.all_reduce(view(x), op="max", stream=named(), async_op=async_op)
                    calls += 1
                    if w is not None:
                        w.wait()
    s.synchronize()
    return len(seen), _C.device_fast_path_counts()[1] - hits == calls, bool((x == float(P)).all().item())


def interface_streams_of_no_use(comm):
    """After hits of the same buffer, a __cuda_array_interface__ naming a stream that no longer lives
    and one of another device: [(case, the error, the Python route's calls, driver calls on this
    thread while it raised)]."""
    import gc

    def run(sub):
        x = emu.from_numpy(np.ones(4, np.float32))
        for _ in range(3):
            sub.all_reduce(x, op="max")
        emu.current_stream().synchronize()
        gone = emu.Stream()
        handle = gone.handle
        del gone
        gc.collect()
        other_device = emu.Stream(1 - x.device_index if x.device_index in (0, 1) else 0)
        out = []
        for case, h in (("gone", handle), ("another device", other_device.handle)):
            before = _C.emulated_thread_driver_calls()
            with route_spy() as seen:
                try:
                    sub.all_reduce(CudaArrayView(x, stream=h), op="max")
                    error = None
                except ValueError as e:
                    error = str(e)
            after = _C.emulated_thread_driver_calls()
            calls = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            out.append((case, error, len(seen), calls))
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def a_dropped_named_stream_is_never_aliased(comm, streams=8):
    """Calls cached on ``stream=`` s (a new object naming it each call), then the caller drops s: the
    entries key s by its identity and hold its stream, so it stays alive (EmulatedDevice.stream_named
    still finds it) and no stream made after it takes its identity, whose calls then run right on
    their own streams. (the dropped stream still alive, a new stream with its identity, results
    right, the Python route's calls)."""
    import gc

    def run(sub):
        sub.all_reduce(emu.from_numpy(np.ones(2, np.float32)))  # the engine's set-up
        P, r = sub.size, sub.rank
        x = emu.from_numpy(np.full(8, float(r + 1), np.float32))
        s = emu.Stream()
        s.wait_event(emu.current_stream().record_event())
        with route_spy() as seen:
            for _ in range(3):
                sub.all_reduce(x, op="max", stream=same_stream(s))
        s.synchronize()
        handle, device = s.handle, emu.device(x.device_index)
        del s
        gc.collect()
        alive = device.stream_named(handle) is not None
        news = [emu.Stream() for _ in range(streams)]
        aliased = any(n.handle == handle for n in news)
        right = True
        with route_spy() as seen_new:
            for n in news:
                y = emu.from_numpy(np.full(5, float(r + 1), np.float32))
                n.wait_event(emu.current_stream().record_event())
                sub.all_reduce(y, stream=same_stream(n))
                n.synchronize()
                right &= bool((y.host_view_unsynchronized() == P * (P + 1) / 2).all())
        right &= bool((x.numpy() == float(P)).all())
        return alive, aliased, right, len(seen) + len(seen_new)
    return with_settings(comm, KERNEL_SETTINGS, run)
