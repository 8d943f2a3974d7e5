"""Rank side of test_fast_device_call.py: which device calls the C++ entry runs from the
communicator's DeviceCallCache (csrc/bindings/device_call_cache.h), counted by
``_C.device_fast_path_counts()`` (calls offered, calls it ran), and that everything else still goes
through the checked Python path."""
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


# Every collective's first call on a set-up engine runs from C++ as a new shape (checked and
# resolved there: csrc/bindings/device_call_new_shape.cc), on the current stream or a named one,
# gather's and scatter's (whose buffers differ per rank) too.
def every_collective_misses(name):
    """The calls of every_collective_hits that take the Python path: all_reduce's first (the
    engine's set-up)."""
    return 1 if name == "all_reduce" else 0


def hits_and_misses(comm, n=5):
    """all_reduce: {case: (C++ hits, results right)} for n repeated calls (the first sets the engine
    up on the Python path and fills the cache), a view of the same memory as another dtype, a slice
    (another pointer and count): each a new shape the C++ entry runs itself; another current stream
    (a new stream and shape, run from C++ too, then hits there) and the default stream again, async
    calls (hits that return works), an async new shape, and the buffers held until executed
    whichever path ran the call;
    "new_shapes": the calls the C++ entry resolved itself over all of them."""
    def run(sub):
        out = {}
        new0 = _C.device_fast_path_new_shape_count()
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
            first = _hits_of(lambda: sub.all_reduce(ints))[0]  # another stream: a new shape from C++
            again = _hits_of(lambda: [sub.all_reduce(ints) for _ in range(2)])[0]
        s.synchronize()
        back = _hits_of(lambda: sub.all_reduce(ints))[0]  # the default stream's entry again
        out["stream"] = ((first, again, back), bool((ints.numpy() == P ** 5).all()))

        def async_calls():
            works = [sub.all_reduce(ints, async_op=True) for _ in range(2)]
            for w in works:
                w.synchronize()
            return all(type(w).__name__ == "DeviceWork" for w in works) and bool((ints.numpy() == P ** 7).all())
        out["async"] = _hits_of(async_calls)

        def async_new_shape():
            # A new shape called async: run from C++, its work the route's (wait() orders the
            # current stream through the route's resolver), the result right.
            fresh = emu.from_numpy(np.full(5, sub.rank + 1, np.int64))
            w = sub.all_reduce(fresh, async_op=True)
            w.wait()
            w.synchronize()
            return type(w).__name__ == "DeviceWork" and bool((fresh.numpy() == P * (P + 1) // 2).all())
        out["async new shape"] = _hits_of(async_new_shape)

        def buffers_released():
            # Both paths' calls hold their buffers in one queue until executed, released by the
            # next call of either path once its engine saw them complete.
            w = emu.from_numpy(np.ones(P, np.int32))
            swapped = emu.empty(P, "int32")
            # A point-to-point batch (all_to_all with splits: from the entry too, device_all_to_allv.cc).
            sub.all_to_all(swapped, w, input_splits=[1] * P, output_splits=[1] * P)
            sub.all_reduce(w)  # run from C++ (a new shape on the current stream)
            held = sub._device()._fast_calls.held() >= 1
            ref = weakref.ref(w)
            del w, swapped
            gc.collect()
            alive_while_queued = ref() is not None
            emu.current_stream().synchronize()
            sub.all_reduce(ints)  # a hit: retires the completed calls, releases their buffers
            gc.collect()
            return held and alive_while_queued and ref() is None
        out["released"] = _hits_of(buffers_released)
        out["new_shapes"] = _C.device_fast_path_new_shape_count() - new0
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def collective_calls(sub, n=4, wrap=None):
    """{collective: (call(async_op, stream), check())} on emulated arrays of this rank: calls whose
    results do not change when repeated, and the check of every rank's result. ``wrap(array)``: what
    the calls pass instead of each array (another library's view of it: foreign_arrays.py), made
    anew for every call, as a caller making a new view of its memory each time does."""
    P, r = sub.size, sub.rank
    w = (lambda a: a) if wrap is None else (lambda a: None if a is None else wrap(a))
    base = np.arange(n, dtype=np.float32)
    mine = base + 10 * r
    blocks = np.concatenate([mine + 100 * j for j in range(P)])  # block j: this rank's to rank j
    arr = emu.from_numpy
    t = {k: arr(v) for k, v in (("ar", mine), ("ag", mine), ("rs", blocks), ("a2a", blocks), ("bc", mine),
                                 ("rd", mine), ("ga", mine))}
    t["ar_out"], t["ag_out"], t["rs_out"], t["a2a_out"] = (emu.empty(n), emu.empty(P * n), emu.empty(n),
                                                           emu.empty(P * n))
    t["ga_out"] = emu.empty(P * n) if r == 0 else None
    t["sc_in"] = arr(np.concatenate([base + 100 * j for j in range(P)])) if r == 0 else None
    t["sc_out"] = emu.empty(n)
    top = base + 10 * (P - 1)
    everyone = np.concatenate([base + 10 * q for q in range(P)])
    return {
        "all_reduce": (lambda a, s: sub.all_reduce(w(t["ar"]), out=w(t["ar_out"]), async_op=a, stream=s),
                       lambda: np.array_equal(t["ar_out"].numpy(), P * base + 10 * P * (P - 1) / 2)),
        "all_gather": (lambda a, s: sub.all_gather(w(t["ag_out"]), w(t["ag"]), async_op=a, stream=s),
                       lambda: np.array_equal(t["ag_out"].numpy(), everyone)),
        "reduce_scatter": (lambda a, s: sub.reduce_scatter(w(t["rs_out"]), w(t["rs"]), op="max", async_op=a, stream=s),
                           lambda: np.array_equal(t["rs_out"].numpy(), top + 100 * r)),
        "all_to_all": (lambda a, s: sub.all_to_all(w(t["a2a_out"]), w(t["a2a"]), async_op=a, stream=s),
                       lambda: np.array_equal(t["a2a_out"].numpy(),
                                              np.concatenate([base + 10 * i + 100 * r for i in range(P)]))),
        "broadcast": (lambda a, s: sub.broadcast(w(t["bc"]), root=P - 1, async_op=a, stream=s),
                      lambda: np.array_equal(t["bc"].numpy(), top)),
        "reduce": (lambda a, s: sub.reduce(w(t["rd"]), root=0, op="max", async_op=a, stream=s),
                   lambda: r != 0 or np.array_equal(t["rd"].numpy(), top)),
        "gather": (lambda a, s: sub.gather(w(t["ga_out"]), w(t["ga"]), root=0, async_op=a, stream=s),
                   lambda: r != 0 or np.array_equal(t["ga_out"].numpy(), everyone)),
        "scatter": (lambda a, s: sub.scatter(w(t["sc_out"]), w(t["sc_in"]), root=0, async_op=a, stream=s),
                    lambda: np.array_equal(t["sc_out"].numpy(), base + 100 * r)),
    }


def every_collective_hits(comm, k=3, wrap=None):
    """Per collective: (hits of [a first call (the first of all sets the engine up on the Python
    path; later ones run from C++ as new shapes), k blocking calls, k async calls, a first call on
    a named stream (read in C++: a new shape run there), k more there], the async calls returned
    works, results right); ``wrap``: as collective_calls'."""
    def run(sub):
        out = {}
        s = emu.Stream()
        for name, (call, check) in collective_calls(sub, wrap=wrap).items():
            def calls():
                call(False, None)
                for _ in range(k):
                    call(False, None)
                works = [call(True, None) for _ in range(k)]
                call(False, s)
                for _ in range(k):
                    call(False, s)
                s.synchronize()
                for w in works:
                    w.synchronize()
                return all(type(w).__name__ == "DeviceWork" for w in works)
            hits, works_ok = _hits_of(calls)
            out[name] = (hits, works_ok, bool(check()))
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


# Bad arguments after hits of the same buffers, otherwise the arguments of the cached calls (so that
# only the bad one tells them apart): (label, call, the error's start).
def _bad_calls(sub, x, g_out, g_in):
    P = sub.size
    return [
        ("op", lambda: sub.all_reduce(x, op="band", algorithm="direct"), "ValueError: op:"),
        ("scale without premul_sum", lambda: sub.all_reduce(x, op="max", scale=2.0, algorithm="direct"), "ValueError: scale:"),
        ("unknown algorithm", lambda: sub.all_reduce(x, op="max", algorithm="no_such"), "ValueError: algorithm:"),
        ("premul_sum without scale", lambda: sub.all_reduce(x, op="premul_sum", algorithm="direct"), "ValueError: scale:"),
        ("algorithm not a str", lambda: sub.all_reduce(x, op="max", algorithm=1), "TypeError: algorithm:"),
        ("op not a str", lambda: sub.all_reduce(x, op=b"max", algorithm="direct"), "ValueError: op:"),
        ("unknown algorithm, async", lambda: sub.all_reduce(x, op="max", algorithm="no_such", async_op=True),
         "ValueError: algorithm:"),
        ("stream of another kind", lambda: sub.all_reduce(x, op="max", algorithm="direct", stream="s"), "TypeError: stream:"),
        ("all_gather output size", lambda: sub.all_gather(g_out[: P * g_in.count - 1], g_in), "ValueError: output:"),
        ("broadcast root", lambda: sub.broadcast(x, root=P), "ValueError: root:"),
        ("reduce_scatter bitwise op on floats", lambda: sub.reduce_scatter(g_in, g_out, op="bxor"), "ValueError: op:"),
    ]


def bad_arguments_after_hits(comm):
    """After hits, bad arguments on the same buffers raise naming the argument and never run in C++:
    ([(label, C++ hits, error, expected start)] per bad call, results right, the cache filled and
    then empty after close)."""
    def run(sub):
        P = sub.size
        x = emu.from_numpy(np.full(4, sub.rank, np.float32))
        g_in = emu.from_numpy(np.full(2, sub.rank, np.float32))
        g_out = emu.empty(2 * P)
        for _ in range(3):
            sub.all_reduce(x, op="max", algorithm="direct")
            sub.all_gather(g_out, g_in)
            sub.broadcast(x, root=0)
            sub.reduce_scatter(g_in, g_out, op="max")
        errors = []
        for label, bad, start in _bad_calls(sub, x, g_out, g_in):
            def caught():
                try:
                    bad()
                    return None
                except (TypeError, ValueError) as e:
                    return f"{type(e).__name__}: {e}"
            hits, error = _hits_of(caught)
            errors.append((label, hits, error, start))
        ok = bool((x.numpy() == P - 1).all())
        # premul_sum is cached with its own scale; a buffer of the same address but another dtype is a new call.
        sub.all_reduce(x, op="premul_sum", scale=0.5, algorithm="direct")
        sub.all_reduce(x, op="premul_sum", scale=0.5, algorithm="direct")
        ok &= bool((x.numpy() == (P - 1) * P * P / 4).all())
        ints = emu.Array(x._alloc, x.device_index, x.offset, x.count, "int32")
        ints.copy_(emu.from_numpy(np.ones(4, np.int32)))
        sub.all_reduce(ints, algorithm="direct")
        ok &= bool((ints.numpy() == P).all())
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


def compressed_calls_hit(comm, n=3):
    """compress= on device buffers (float32, 1000 elements: several blocks of the codec) through the
    C++ entry: per (collective, how compress= is given: a codec's name or a Codec object), (the Python
    route's calls among 1 + n calls, C++ entry hits, every hit's result bitwise the first call's, which
    the Python route ran, and that result within the codec's error bound of the exact one)."""
    from commlib.core.codecs import ERROR_BOUND, Codec
    from entry_stream_cases import route_spy

    def run(sub):
        P, r, count = sub.size, sub.rank, 1000
        sub.all_reduce(emu.from_numpy(np.ones(2, np.float32)))  # the engine's set-up
        base = np.linspace(-3.0, 5.0, count, dtype=np.float32)
        out = {}
        for given in ("int8", Codec("int8", block_size=64)):
            mine = base * (r + 1)
            x = emu.from_numpy(mine)
            blocks = emu.from_numpy(np.concatenate([base * (r + 1 + j) for j in range(P)]))
            calls = {
                "all_reduce": (lambda y, c: sub.all_reduce(x, out=y, compress=c), count,
                               base * (P * (P + 1) / 2)),
                "all_gather": (lambda y, c: sub.all_gather(y, x, compress=c), P * count,
                               np.concatenate([base * (q + 1) for q in range(P)])),
                "reduce_scatter": (lambda y, c: sub.reduce_scatter(y, blocks, compress=c), count,
                                   base * sum(q + 1 + r for q in range(P))),
            }
            for name, (call, size, exact) in calls.items():
                y = emu.empty(size)
                hits = _hits()
                with route_spy() as seen:
                    call(y, given)
                    first = y.numpy().copy()
                    same = True
                    for _ in range(n):
                        y.copy_(emu.from_numpy(np.zeros(size, np.float32)))
                        call(y, given)
                        same &= np.array_equal(y.numpy(), first)
                scale = np.abs(exact).max()
                # Each of at most 2P encodings on the way (every contribution, and a ring's partial sums
                # re-encoded) is within 1/127 of its block's largest magnitude, at most `scale`.
                close = bool(np.abs(first - exact).max() <= 2 * P * ERROR_BOUND["int8"] * scale)
                out[(name, type(given).__name__)] = (len(seen), _hits() - hits, bool(same), close)
        return out
    return with_settings(comm, {}, run)
