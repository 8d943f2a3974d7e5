"""Rank side of test_entry_a2av.py: all_to_all with split sizes (a point-to-point batch) through the
C++ entry (csrc/bindings/device_all_to_allv.cc), and a call on ``stream=`` whose buffer's
``__cuda_array_interface__`` names its own stream (csrc/bindings/device_own_stream.cc), with spies
on the Python route (DeviceRoute.p2p and DeviceRoute.run). Values encode (sender, receiver,
index), so a block read from the wrong place, too early or from the wrong peer shows."""
import collections
import contextlib

import numpy as np

import commlib._C as _C
import commlib.emulated as emu
from commlib.core import device_route
from entry_stream_cases import same_stream
from foreign_arrays import CudaArrayView
from kernel_path_cases import KERNEL_SETTINGS, with_settings

# a2av_counts' segment: calls counted between stream synchronizations (at most this many in flight)
A2AV_SEGMENT = 10


@contextlib.contextmanager
def route_spy():
    """The Python route's device calls inside the block (DeviceRoute.run and .p2p): yields the list
    each call appends its method's name to."""
    seen = []
    real_run, real_p2p = device_route.DeviceRoute.run, device_route.DeviceRoute.p2p

    def run(self, *args, **kw):
        seen.append("run")
        return real_run(self, *args, **kw)

    def p2p(self, *args, **kw):
        seen.append("p2p")
        return real_p2p(self, *args, **kw)
    device_route.DeviceRoute.run, device_route.DeviceRoute.p2p = run, p2p
    try:
        yield seen
    finally:
        device_route.DeviceRoute.run, device_route.DeviceRoute.p2p = real_run, real_p2p


def _message(src, dst, n, salt):
    return (np.arange(n, dtype=np.int64) * 7 + src * 1000 + dst * 100 + salt * 10000).astype(np.int64)


def _splits(P, salt):
    """Split sizes send[i][j] (rank i to rank j) for call ``salt``: zeros, ones, primes, fewer
    elements than ranks, uneven, and a new shape at every call."""
    sizes = [0, 1, 2, 3, 5, 13, 97]
    return [[sizes[(i * 3 + j * 5 + salt) % len(sizes)] for j in range(P)] for i in range(P)]


def a2av_call(sub, salt, stream=None, own=None):
    """(call(async_op), check()) of all_to_all with splits for call ``salt`` on ``sub``: ``stream``
    a function giving the stream= argument at each call; ``own``: an emulated stream the arrays'
    __cuda_array_interface__ names (their data is valid there), else the arrays themselves."""
    P, r = sub.size, sub.rank
    send = _splits(P, salt)
    ins = [send[r][j] for j in range(P)]
    outs = [send[i][r] for i in range(P)]
    x = emu.from_numpy(np.concatenate([_message(r, j, ins[j], salt) for j in range(P)]))
    y = emu.from_numpy(np.full(max(sum(outs), 1), -1, np.int64))
    y_used = y if sum(outs) else emu.empty(0, "int64")
    want = np.concatenate([_message(i, r, outs[i], salt) for i in range(P)])
    a, b = (x, y_used) if own is None else (CudaArrayView(x, stream=own.handle), CudaArrayView(y_used, stream=own.handle))
    stream = stream or (lambda: None)

    def call(async_op):
        return sub.all_to_all(b, a, output_splits=list(outs), input_splits=tuple(ins), async_op=async_op,
                              stream=stream())

    def check():
        return np.array_equal(y.host_view_unsynchronized()[:len(want)], want)
    return call, check


def a2av_from_the_entry(comm, calls=4):
    """After one all_reduce set the engine up (the Python route), all_to_all with splits of a new
    shape at every call on the current stream, on ``stream=`` (a new object naming a stream no call
    ran on) and on the interface's own stream, blocking and async: {case: (the Python route's calls,
    batches the entry ran, calls made, async works' wait() resolved to the call's stream, results
    right)}."""
    def run(sub):
        sub.all_reduce(emu.from_numpy(np.ones(2, np.float32)))  # the engine's set-up
        emu.current_stream().synchronize()
        out = {}
        for case in ("current", "stream=", "interface's stream"):
            s = emu.Stream()
            named = (lambda: same_stream(s)) if case == "stream=" else None
            own = s if case == "interface's stream" else None
            want = s.handle if own is not None else _C.stream_identity(emu.current_stream()._stream)
            made, waits_ok, checks, before = 0, True, [], _C.device_all_to_allv_count()
            with route_spy() as seen:
                for salt in range(calls):
                    for async_op in (False, True):
                        call, check = a2av_call(sub, 2 * salt + async_op, named, own)
                        s.wait_event(emu.current_stream().record_event())  # the arrays' uploads
                        w = call(async_op)
                        made += 1
                        checks.append(check)
                        if w is not None:
                            waits_ok &= _C.stream_identity(w._stream_of(None)) == want
                            w.wait()
            s.synchronize()
            emu.current_stream().synchronize()
            out[case] = (list(seen), _C.device_all_to_allv_count() - before, made, waits_ok,
                         all(c() for c in checks))
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def a2av_bad_arguments(comm):
    """After all_to_all calls with splits from the entry, the same call with one argument wrong: [(case, the
    exception's type and message, driver calls on this thread while it raised)]: each raised by the
    Python path naming the argument, with nothing enqueued."""
    def run(sub):
        P, r = sub.size, sub.rank
        sub.all_reduce(emu.from_numpy(np.ones(2, np.float32)))  # the engine's set-up
        ins = [2] * P
        x = emu.from_numpy(np.arange(2 * P, dtype=np.int64))
        y = emu.from_numpy(np.zeros(2 * P, np.int64))
        for _ in range(2):
            sub.all_to_all(y, x, output_splits=ins, input_splits=ins)
        emu.current_stream().synchronize()
        short = ins[:-1]
        negative = [-1] + [2] * (P - 2) + [4]
        other_self = list(ins)
        other_self[r], other_self[(r + 1) % P] = 1, 3
        y32 = emu.from_numpy(np.zeros(2 * P, np.int32))
        emu.current_stream().synchronize()
        cases = {
            "input_splits length": lambda: sub.all_to_all(y, x, output_splits=ins, input_splits=short),
            "output_splits sum": lambda: sub.all_to_all(y, x, output_splits=[3] * P, input_splits=ins),
            "negative split": lambda: sub.all_to_all(y, x, output_splits=ins, input_splits=negative),
            "own block": lambda: sub.all_to_all(y, x, output_splits=ins, input_splits=other_self),
            "overlap": lambda: sub.all_to_all(x, x, output_splits=ins, input_splits=ins),
            "dtype": lambda: sub.all_to_all(y32, x, output_splits=ins, input_splits=ins),
            "algorithm": lambda: sub.all_to_all(y, x, output_splits=ins, input_splits=ins, algorithm="nope"),
            "stream type": lambda: sub.all_to_all(y, x, output_splits=ins, input_splits=ins, stream="s"),
        }
        out = []
        for case, bad in cases.items():
            before = _C.emulated_thread_driver_calls()
            try:
                bad()
                error = None
            except (TypeError, ValueError) as e:
                error = (type(e).__name__, str(e))
            after = _C.emulated_thread_driver_calls()
            out.append((case, error, {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}))
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def a2av_counts(comm, n=200, k=A2AV_SEGMENT):
    """The driver calls of n steady all_to_all calls with splits (blocking, current stream) on this
    thread, through the Python route (the same splits as a NumPy array, which only the Python path
    reads) and through the entry (list splits), each after n uncounted calls through the entry:
    (entry's, route's, the Python route's calls during the entry's, batches the entry ran, results
    right). Counted in segments of k calls with the stream synchronized between them (uncounted),
    so at most k + 1 calls are ever in flight whatever the host's and the device's relative speeds
    (CI's machine ran the host further ahead of the emulated device than this one: the engine's
    event pool and retire polls followed the lag, not the calls)."""
    from call_count_cases import _diff

    def run(sub):
        sub.all_reduce(emu.from_numpy(np.ones(2, np.float32)))  # the engine's set-up
        call, check = a2av_call(sub, 1)

        def segmented(count):
            total = collections.Counter()
            for start in range(0, count, k):
                before = _C.emulated_thread_driver_calls()
                for _ in range(min(k, count - start)):
                    call(False)
                total.update(_diff(before, _C.emulated_thread_driver_calls()))
                emu.current_stream().synchronize()
            return dict(total)

        as_arrays = lambda b, a, output_splits, input_splits, **kw: real(  # noqa: E731
            b, a, output_splits=np.array(output_splits), input_splits=np.array(input_splits), **kw)
        real = sub.all_to_all
        counts = {}
        with route_spy() as seen:
            for path in ("route", "entry"):
                segmented(n)
                if path == "route":
                    sub.all_to_all = as_arrays
                seen_before, ran = len(seen), _C.device_all_to_allv_count()
                counted = segmented(n)
                counts[path] = (counted, len(seen) - seen_before, _C.device_all_to_allv_count() - ran)
                if path == "route":
                    del sub.all_to_all
        assert counts["route"][1:] == (n, 0), counts["route"][1:]  # (all on the Python route)
        return counts["entry"][0], counts["route"][0], counts["entry"][1], counts["entry"][2], bool(check())
    return with_settings(comm, KERNEL_SETTINGS, run)


def stream_waits_on_the_interfaces_stream(comm, first="all_reduce", count=4096):
    """A __cuda_array_interface__ naming its own stream ``s`` (where a copy behind 50 others is still
    writing the data) in a call on another stream (``stream=t``), with no synchronization by the
    caller: the call must run after the copy. all_reduce three times (a new shape, another and a
    hit) and all_to_all with splits, ``first`` the device's first call (the Python route sets the
    engine up and waits itself), the rest from the entry: ([results right, all_reduce's then
    all_to_all's], the Python route's calls after the first)."""
    def run(sub):
        P, r = sub.size, sub.rank
        s, t = emu.Stream(), emu.Stream()
        junk = emu.from_numpy(np.zeros(16, np.float32))
        seen_all = []

        def slow_copy(dst, src):  # a copy on s behind 50 others: about 1 ms of the emulated delay
            for _ in range(50):
                junk.copy_(junk, stream=s)
            dst.copy_(src, stream=s)

        def all_reduces():
            rights = []
            later = emu.from_numpy(np.zeros(count + 1, np.float32))  # (steps 1 and 2: one buffer, a hit)
            for step in range(3):
                x = later if step else emu.from_numpy(np.zeros(count, np.float32))
                src = emu.from_numpy(np.full(x.count, (r + 1) * (step + 1), np.float32))
                emu.current_stream().synchronize()  # x and src uploaded; s and t know nothing of each other
                with route_spy() as seen:
                    slow_copy(x, src)
                    sub.all_reduce(CudaArrayView(x, stream=s.handle), stream=same_stream(t))
                seen_all.append(len(seen))
                t.synchronize()
                rights.append(bool((x.host_view_unsynchronized() == (step + 1) * P * (P + 1) / 2).all()))
                s.synchronize()  # (src lives until s copied it, whatever the call waited for)
            return rights

        def a2av():  # input written on s, the batch on t
            send = _splits(P, 3)
            ins, outs = [send[r][j] for j in range(P)], [send[i][r] for i in range(P)]
            src = emu.from_numpy(np.concatenate([_message(r, j, ins[j], 3) for j in range(P)]))
            x = emu.from_numpy(np.zeros(sum(ins), np.int64))
            y = emu.from_numpy(np.zeros(sum(outs), np.int64))
            emu.current_stream().synchronize()
            with route_spy() as seen:
                slow_copy(x, src)
                sub.all_to_all(y, CudaArrayView(x, stream=s.handle), output_splits=outs, input_splits=ins,
                               stream=same_stream(t))
            seen_all.append(len(seen))
            t.synchronize()
            right = bool(np.array_equal(y.host_view_unsynchronized(),
                                        np.concatenate([_message(i, r, outs[i], 3) for i in range(P)])))
            s.synchronize()
            return [right]
        if first == "all_reduce":
            rights = all_reduces() + a2av()
        else:
            rights = a2av()
            rights = all_reduces() + rights
        return rights, sum(seen_all[1:])
    return with_settings(comm, KERNEL_SETTINGS, run)
