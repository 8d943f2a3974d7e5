"""Rank side of test_fast_device_call.py: which calls the C++ cached device all_reduce
(csrc/bindings/device_fast_call.cc) runs, counted by ``_C.device_fast_path_counts()`` (calls
offered, calls it ran), and that everything else still goes through the checked Python path."""
import gc
import weakref

import numpy as np

import commlib._C as _C
import commlib.emulated as emu
from kernel_path_cases import KERNEL_SETTINGS, with_settings


def _hits():
    return _C.device_fast_path_counts()[1]


def _hits_of(fn):
    """(hits of the C++ path while fn() ran, fn's result)."""
    before = _hits()
    result = fn()
    return _hits() - before, result


def hits_and_misses(comm, n=5):
    """{case: (C++ hits, results right)} for: n repeated calls (the first fills the cache), a view of
    the same memory as another dtype, a slice (another pointer and count), another stream (a miss,
    then hits there) and the default stream again, async calls (the Python path: they return a work)."""
    def run(sub):
        out = {}
        P = sub.size
        x = emu.from_numpy(np.full(6, sub.rank + 1, np.int32))

        def repeated():
            for _ in range(n):
                sub.all_reduce(x, algorithm="ring")
            return bool((x.numpy() == (P * (P + 1) // 2) * P ** (n - 1)).all())
        out["repeated"] = _hits_of(repeated)
        # The same address and count as float32: another dtype, a new call (bits as float: max of equals).
        as_float = emu.Array(x._alloc, x.device_index, x.offset, x.count, "float32")
        expect = x.numpy().view(np.float32).copy()
        out["dtype"] = _hits_of(lambda: sub.all_reduce(as_float, op="max", algorithm="ring")
                                or bool((as_float.numpy() == expect).all()))
        y = emu.from_numpy(np.arange(6, dtype=np.int64))
        sub.all_reduce(y, algorithm="ring")  # cached as its own call
        z = y[1:]  # another pointer and count, the same memory
        out["pointer"] = _hits_of(lambda: sub.all_reduce(z, algorithm="ring")
                                  or bool((y.numpy()[1:] == np.arange(1, 6) * P * P).all()))
        s = emu.Stream()
        ints = emu.from_numpy(np.ones(3, np.int64))
        sub.all_reduce(ints)
        with emu.use_stream(s):
            s.wait_event(emu.current_stream(ints.device_index).record_event())  # the last call's result
            first = _hits_of(lambda: sub.all_reduce(ints))[0]  # a miss: another stream
            again = _hits_of(lambda: [sub.all_reduce(ints) for _ in range(2)])[0]
        s.synchronize()
        back = _hits_of(lambda: sub.all_reduce(ints))[0]  # the default stream's entry again
        out["stream"] = ((first, again, back), bool((ints.numpy() == P ** 5).all()))

        def async_calls():
            works = [sub.all_reduce(ints, async_op=True) for _ in range(2)]
            for w in works:
                w.synchronize()
            return all(w is not None for w in works) and bool((ints.numpy() == P ** 7).all())
        out["async"] = _hits_of(async_calls)

        def buffers_released():
            # Both paths' calls hold their buffers in one queue until executed, released by the
            # next call of either path once the stream ran them.
            w = emu.from_numpy(np.ones(2, np.int32))
            sub.all_reduce(w)  # the Python path (a miss)
            sub.all_reduce(w)  # a hit
            held = sub._device()._fast_calls.held() >= 1
            ref = weakref.ref(w)
            del w
            gc.collect()
            alive_while_queued = ref() is not None
            emu.current_stream().synchronize()
            sub.all_reduce(ints)  # a hit: polls the queue
            gc.collect()
            return held and alive_while_queued and ref() is None
        out["released"] = _hits_of(buffers_released)
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def bad_arguments_after_hits(comm):
    """After hits, bad arguments on the same buffer raise naming the argument and never run in C++:
    ([(C++ hits, error)] per bad call, results right, whether the cache is empty after close)."""
    def run(sub):
        x = emu.from_numpy(np.full(4, sub.rank, np.float32))
        for _ in range(3):
            sub.all_reduce(x, op="max", algorithm="direct")
        errors = []
        for kwargs in (dict(op="band"), dict(op="max", scale=2.0), dict(op="max", algorithm="no_such"),
                       dict(op="premul_sum"), dict(op="max", algorithm=1), dict(op=b"max"),
                       dict(op="max", algorithm="no_such", async_op=True)):
            def bad():
                try:
                    sub.all_reduce(x, **kwargs)
                    return None
                except (TypeError, ValueError) as e:
                    return f"{type(e).__name__}: {e}"
            errors.append(_hits_of(bad))
        ok = bool((x.numpy() == sub.size - 1).all())
        route = sub._device()
        filled = len(route._fast_calls) > 0
        sub.close()
        return errors, ok, filled and len(route._fast_calls) == 0
    return with_settings(comm, KERNEL_SETTINGS, run)


def cuda_hits(comm, n=4):
    """hits_and_misses' core on torch CUDA tensors (GPU 0; test_cuda_ranks.py, skipped without a
    GPU): ((hits of n repeated calls, of the first call on another torch stream, of two more there,
    of a bad op after them), (the bad op's error), results right)."""
    import torch
    torch.cuda.set_device(0)
    P = comm.size
    x = torch.full((6,), comm.rank + 1, dtype=torch.int32, device="cuda")

    def repeated():
        for _ in range(n):
            comm.all_reduce(x)
    hits = [_hits_of(repeated)[0]]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        hits.append(_hits_of(lambda: comm.all_reduce(x))[0])
        hits.append(_hits_of(lambda: [comm.all_reduce(x) for _ in range(2)])[0])
    torch.cuda.current_stream().wait_stream(s)
    error = None
    before = _hits()
    try:
        comm.all_reduce(x, op="band", algorithm="no_such")
    except ValueError as e:
        error = str(e)
    hits.append(_hits() - before)
    ok = bool((x.cpu() == (P * (P + 1) // 2) * P ** (n + 2)).all())
    return tuple(hits), error, ok
