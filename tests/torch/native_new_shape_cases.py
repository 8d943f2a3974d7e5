"""Rank side of test_cuda_new_shapes_emulated.py: the C++ backend's CUDA path (device_calls.cc,
``device_run``) on calls of a shape the Python path never ran, on an engine and stream it set up
(csrc/bindings/device_call_new_shape.cc), driven with ``commlib.emulated`` memory through the
backend's test seam ``CommlibBackend._device_collective`` (torch's CPU build has no CUDA tensor).
A call the seam declines is handed to the Python communicator, as the backend hands it over; a spy
on the Python device route (``DeviceRoute.run``) records every call that reached it. Values are
checked exactly (integers, and float32 sums of small integers, which are exact).
"""
from __future__ import annotations

import time

import numpy as np

import commlib.emulated as emu
from commlib import _C
from commlib.core.call_spec import COLLECTIVE, DTYPE, OP
from commlib.settings import overridden
from commlib.torch import native
from commlib.torch.backend import ProcessGroupCommlib

# The kernel path (captures need it: the copy path refuses them), small slots so larger calls take
# several chunks (tests/stream/kernel_path_cases.py's settings).
KERNEL_SETTINGS = {"COMMLIB_DEVICE_PATH": "kernel", "COMMLIB_DEVICE_SLOT_BYTES": "4096",
                   "COMMLIB_DEVICE_SLOTS": "2", "COMMLIB_DEVICE_LL_BYTES": "1024"}


class Offers:
    """The group's C++ CUDA entry (the seam), else the Python communicator (the hand-over), with a
    spy on the Python device route. ``a``: the input (all_reduce/broadcast/reduce: the tensor),
    ``b``: the output of two-buffer collectives; ``count`` as the backend describes the call (the
    input's for all_gather, the output's for reduce_scatter, one block for all_to_all)."""

    def __init__(self, comm, settings=None):
        P, r = comm.size, comm.rank
        with overridden(settings or {}):  # the engine is made at the group's first device call
            self.pg = ProcessGroupCommlib(comm.split(0), r, P)
            self.comm = self.pg._comm
            self.route = self.comm._device()
        self.settings = settings or {}
        self.backend = native.wrap(self.pg)
        self.python_calls = []
        run = self.route.run

        def spy(coll, *args, **kwargs):
            self.python_calls.append(coll)
            return run(coll, *args, **kwargs)
        self.route.run = spy

    def seam(self, coll, a, b=None, count=None, root=0, op="sum", stream=None):
        """The C++ entry alone: its Work, or None when it declined (nothing ran). The settings
        hold here too: the group's first call sets the engine up from C++."""
        with overridden(self.settings):
            return self._seam(coll, a, b, count, root, op, stream)

    def _seam(self, coll, a, b, count, root, op, stream):
        return self.backend._device_collective(
            int(COLLECTIVE[coll]), int(DTYPE[a.dtype]), a.count if count is None else count, a.data_ptr(),
            (b if b is not None else a).data_ptr(), int(OP[op]), root, 1.0, b is not None, a.device_index,
            _C.emulated_current_stream() if stream is None else stream)

    def call(self, coll, a, b=None, count=None, root=0, op="sum"):
        """The C++ entry, else the Python communicator (async, on the current stream)."""
        w = self.seam(coll, a, b, count, root, op)
        if w is not None:
            return w
        c = self.comm
        with overridden(self.settings):
            if coll == "all_reduce":
                return c.all_reduce(a, op=op, async_op=True)
            if coll == "reduce":
                return c.reduce(a, root=root, op=op, async_op=True)
            if coll == "broadcast":
                return c.broadcast(a, root=root, async_op=True)
            if coll == "all_gather":
                return c.all_gather(b, a, async_op=True)
            if coll == "reduce_scatter":
                return c.reduce_scatter(b, a, op=op, async_op=True)
            return c.all_to_all(b, a, async_op=True)

    def shutdown(self):
        try:
            self.pg.shutdown()
        except Exception:  # noqa: BLE001 - a failed engine's error may be reported again here
            pass


def _fresh_calls(o, P, r, n, i):
    """One round of every collective on fresh buffers of `n` elements: [(work, array, wanted)]."""
    base = np.arange(n, dtype=np.int64) % 7
    out = []
    x = emu.from_numpy((base + r).astype(np.float32))  # sum: exact in float32 (small integers)
    out.append((o.call("all_reduce", x), x, (P * base + P * (P - 1) // 2).astype(np.float32)))
    y = emu.from_numpy((base * (r + 1)).astype(np.int32))
    out.append((o.call("all_reduce", y, op="max"), y, (base * P).astype(np.int32)))
    root = i % P
    z = emu.from_numpy(base + 1000 * r)
    out.append((o.call("broadcast", z, root=root), z, base + 1000 * root))
    g_in = emu.from_numpy((base + 10 * r).astype(np.int32))
    g_out = emu.empty(n * P, "int32")
    out.append((o.call("all_gather", g_in, g_out, count=n), g_out,
                np.concatenate([base + 10 * q for q in range(P)]).astype(np.int32)))
    rs_in = emu.from_numpy(np.tile(base, P).astype(np.float32) + r)
    rs_out = emu.empty(n, "float32")
    out.append((o.call("reduce_scatter", rs_in, rs_out, count=n), rs_out,
                (P * base + P * (P - 1) // 2).astype(np.float32)))
    a_in = emu.from_numpy(np.concatenate([base + 100 * r + 10 * j for j in range(P)]))
    a_out = emu.empty(n * P, "int64")
    out.append((o.call("all_to_all", a_in, a_out, count=n), a_out,
                np.concatenate([base + 100 * q + 10 * r for q in range(P)])))
    red_root = (i + 1) % P
    v = emu.from_numpy((base + r).astype(np.int32))
    want = (P * base + P * (P - 1) // 2).astype(np.int32) if r == red_root else None
    out.append((o.call("reduce", v, root=red_root), v, want))
    return out


def fresh_buffers_run_from_cpp(comm, counts=(0, 1, 2, 13, 1000, 4099)):
    """The first device call on this group and stream goes through the Python route (it sets the
    engine up and wraps the stream); after it, rounds of every collective (all_reduce sum and max,
    broadcast and reduce from roots that change, all_gather, reduce_scatter, all_to_all) on fresh
    buffers of each count are new shapes, every one run from C++; then the same buffers again hit
    the entries C++ kept. Returns (the Python route's calls, calls after set-up, new shapes run from
    C++, C++ hits, repeats that were new shapes, wrong results)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    first = emu.from_numpy(np.full(8, r + 1, np.float32))
    o.call("all_reduce", first).synchronize()  # set-up: the engine, the stream's wrapper
    new0, hits0 = _C.device_native_new_shape_count(), _C.device_native_counts()[1]
    done = [c for i, n in enumerate(counts) for c in _fresh_calls(o, P, r, n, i)]
    for w, _, _ in done:
        w.synchronize()
    new, hits = _C.device_native_new_shape_count() - new0, _C.device_native_counts()[1] - hits0
    wrong = [f"call {k}: {a.numpy()[:4]} expected {want[:4]}" for k, (_, a, want) in enumerate(done)
             if want is not None and not np.array_equal(a.numpy(), want)]
    # The same buffers (and shapes) again: the entries kept at their first call, no new shape.
    new1 = _C.device_native_new_shape_count()
    x = emu.from_numpy(np.ones(5, np.float32))
    o.call("all_reduce", x).synchronize()  # a new shape ...
    o.call("all_reduce", x).synchronize()  # ... kept: this one hits
    repeats_new = _C.device_native_new_shape_count() - new1 - 1
    if not np.array_equal(x.numpy(), np.full(5, P * P, np.float32)):
        wrong.append(f"repeat: {x.numpy()} expected {P * P}")
    o.shutdown()
    return o.python_calls, len(done), new, hits, repeats_new, wrong


def bad_arguments_name_themselves(comm):
    """On a set-up engine and stream, a broadcast from a root out of range and a bitwise op on
    float32 are declined by C++ (nothing ran), then the Python path raises naming the argument;
    nothing was enqueued for them (a fresh all_reduce after them is right on every rank).
    Returns (seam results, the errors, new shapes counted for them, whether the later call is right)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    o.call("all_reduce", emu.from_numpy(np.ones(8, np.float32))).synchronize()  # set-up
    y = emu.from_numpy(np.full(5, r, np.float32))
    new0 = _C.device_native_new_shape_count()
    seam = [o.seam("broadcast", y, root=P) is None, o.seam("all_reduce", y, op="band") is None]
    errors = []
    for coll, kwargs in (("broadcast", {"root": P}), ("all_reduce", {"op": "band"})):
        try:
            o.call(coll, y, **kwargs)
            errors.append("no error")
        except Exception as e:  # noqa: BLE001 - the message is the result
            errors.append(f"{type(e).__name__}: {e}")
    counted = _C.device_native_new_shape_count() - new0
    x = emu.from_numpy(np.full(7, r + 1, np.float32))
    o.call("all_reduce", x).synchronize()
    right = bool(np.array_equal(x.numpy(), np.full(7, P * (P + 1) // 2, np.float32)))
    o.shutdown()
    return seam, errors, counted, right


def mismatched_new_shapes(comm, late_rank=None):
    """On a set-up engine and stream, rank r all_reduces 40 + 4 r floats of a fresh buffer: a new
    shape run from C++ on every rank, which the engines find mismatched. Returns (whether it ran
    from C++, "Type: message" of what the call or its synchronize raised). A rank whose engine a
    peer failed before this rank's call raises from the C++ entry itself (the engine refuses the
    enqueue, so no new shape is counted): that ran from C++ too."""
    r = comm.rank
    o = Offers(comm)
    o.call("all_reduce", emu.from_numpy(np.ones(8, np.float32))).synchronize()  # set-up
    new0 = _C.device_native_new_shape_count()
    x = emu.from_numpy(np.ones(40 + 4 * r, np.float32))
    seen, declined, raised_by_seam = "no error", False, False
    if r == late_rank:
        time.sleep(1.0)
    try:
        try:
            w = o.seam("all_reduce", x)
        except Exception:  # noqa: BLE001 - re-raised: the kind is the result
            raised_by_seam = True
            raise
        declined = w is None
        (o.call("all_reduce", x) if declined else w).synchronize()
    except Exception as e:  # noqa: BLE001 - the kind is the result
        seen = f"{type(e).__name__}: {e}"
    counted = _C.device_native_new_shape_count() - new0
    from_cpp = not declined and o.python_calls == [] and (counted == 1 or (raised_by_seam and counted == 0))
    o.shutdown()
    return from_cpp, seen


def captured_new_shapes(comm):
    """The capture rules hold for calls run from C++ (docs/gpu.md, "Stream capture"), on the kernel
    path, on a side stream no call ran on before (the set-up ran on the default stream; C++ wraps
    the side stream at its first call): a shape never run eagerly, captured from C++, is refused
    naming the warm-up; once a call of it ran eagerly from C++, its capture records it and three
    replays run it. Returns (the refusal, the Python route's calls, streams C++ wrapped, the result
    right)."""
    P, r = comm.size, comm.rank
    o = Offers(comm, KERNEL_SETTINGS)
    o.call("all_reduce", emu.from_numpy(np.ones(8, np.float32))).synchronize()  # set-up, default stream
    side = emu.Stream()
    x = emu.from_numpy(np.ones(24, np.float32))
    emu.current_stream().synchronize()  # x's upload (on the default stream) before `side` reads it
    wrapped0 = _C.device_native_stream_count()
    with emu.use_stream(side):
        refused = "no error"
        try:
            with emu.graph(emu.Graph(), stream=side):
                o.seam("all_reduce", x)
        except Exception as e:  # noqa: BLE001 - the message is the result
            refused = f"{type(e).__name__}: {e}"
        o.call("all_reduce", x).synchronize()  # the warm-up, eager, from C++: x = P
        g = emu.Graph()
        with emu.graph(g, stream=side):
            captured = o.seam("all_reduce", x)
        for _ in range(3):
            g.replay()
        side.synchronize()
    wrapped = _C.device_native_stream_count() - wrapped0
    right = captured is not None and bool(np.array_equal(x.numpy(), np.full(24, P ** 4, np.float32)))
    g.reset()
    o.shutdown()
    return refused, o.python_calls, wrapped, right


def new_streams_run_from_cpp(comm, streams=3, rounds=4):
    """After the set-up call (on the default stream), calls on streams no call ran on before run
    from C++, each stream wrapped in C++ once (EmulatedDevice::stream_named through the call
    cache: csrc/bindings/device_p2p_streams.h): rounds of every collective on fresh buffers, each
    round of seven on the next of `streams` new streams and the default one in turn (a side stream per
    bucket), every work synchronized at the end. Returns (the Python route's calls, calls after
    the set-up, C++ hits among them, streams wrapped, wrong results)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    o.call("all_reduce", emu.from_numpy(np.full(8, r + 1, np.float32))).synchronize()  # set-up
    side = [emu.Stream() for _ in range(streams)]
    hits0, wrapped0 = _C.device_native_counts()[1], _C.device_native_stream_count()
    done, k = [], 0
    for i in range(rounds):
        for n in (1, 13, 1000):  # each round of seven on the next stream in turn
            s = ([None] + side)[k % (streams + 1)]
            k += 1
            if s is None:
                done += _fresh_calls(o, P, r, n, i)
            else:
                with emu.use_stream(s):
                    done += _fresh_calls(o, P, r, n, i)
    for w, _, _ in done:
        w.synchronize()
    hits, wrapped = _C.device_native_counts()[1] - hits0, _C.device_native_stream_count() - wrapped0
    wrong = [f"call {j}: {a.numpy()[:4]} expected {want[:4]}" for j, (_, a, want) in enumerate(done)
             if want is not None and not np.array_equal(a.numpy(), want)]
    o.shutdown()
    return o.python_calls, len(done), hits, wrapped, wrong


def _count_batches(route):
    """A list that gains an item for every point-to-point batch the Python route runs from now on."""
    batches = []
    p2p = route.p2p

    def spy(*args, **kwargs):
        batches.append(1)
        return p2p(*args, **kwargs)
    route.p2p = spy
    return batches


def stream_set_up_by_a_batch(comm, device=7):
    """A stream the route set up with a point-to-point batch (no collective ran on it) serves new
    shapes of collectives from C++ too: the set-up is per stream, not per collective. Returns (the
    Python route's collectives, the batches it ran, new shapes from C++, the all_reduce right)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    batches = _count_batches(o.route)
    a = emu.from_numpy(np.full(4, r, np.float32), device_index=device)
    b = emu.empty(4, "float32", device_index=device)
    o.comm.batch_p2p([("recv", b, (r - 1) % P), ("send", a, (r + 1) % P)])  # the set-up on this stream
    new0 = _C.device_native_new_shape_count()
    x = emu.from_numpy(np.full(9, r + 1, np.float32), device_index=device)
    o.call("all_reduce", x).synchronize()
    right = bool(np.array_equal(x.numpy(), np.full(9, P * (P + 1) // 2, np.float32)))
    new = _C.device_native_new_shape_count() - new0
    o.shutdown()
    return o.python_calls, len(batches), new, right


def new_shapes_cost_what_hits_do(comm, n=100):
    """n all_reduces of 16 floats on fresh buffers (each a new shape, resolved in C++) after one call
    of that count warmed its plan: the emulated driver calls this thread makes in the n calls (the
    resolution is the host's: StreamEngine::prepare), the new shapes run from C++, results right."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    warm = emu.from_numpy(np.ones(16, np.float32))  # (kept: a fresh buffer must not reuse its address)
    o.call("all_reduce", warm).synchronize()  # set-up, the plan
    fresh = [emu.from_numpy(np.full(16, r + 1, np.float32)) for _ in range(n)]
    emu.current_stream().synchronize()
    new0 = _C.device_native_new_shape_count()
    before = _C.emulated_thread_driver_calls()
    works = [o.seam("all_reduce", x) for x in fresh]
    after = _C.emulated_thread_driver_calls()
    calls = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    new = _C.device_native_new_shape_count() - new0
    for w in works:
        w.synchronize()
    right = all(np.array_equal(x.numpy(), np.full(16, P * (P + 1) // 2, np.float32)) for x in fresh)
    o.shutdown()
    return calls, new, right


def p2p_on_a_new_stream(comm, n=64):
    """After the set-up call (a collective on the default stream), a receive-first ring of sends and
    receives on a stream no call ran on runs from C++ (the backend's hold and batches, the seam of
    ``hold_device_message``): the stream wrapped in C++, one engine batch, exact. Returns (the
    Python route's calls and batches, batches from C++, streams wrapped, the message right)."""
    P, r = comm.size, comm.rank
    o = Offers(comm)
    batches = _count_batches(o.route)
    o.call("all_reduce", emu.from_numpy(np.ones(8, np.float32))).synchronize()  # set-up
    side = emu.Stream()
    a = emu.from_numpy(np.arange(n, dtype=np.float32) + 100 * r)
    b = emu.empty(n, "float32")
    emu.current_stream().synchronize()
    p2p0, wrapped0 = _C.device_native_p2p_count(), _C.device_native_stream_count()
    with emu.use_stream(side):
        works = o.backend._device_p2p([(False, b.data_ptr(), b.nbytes, (r - 1) % P),
                                        (True, a.data_ptr(), a.nbytes, (r + 1) % P)], 0,
                                       _C.emulated_current_stream())
        for w in works:
            w.wait()
        for w in works:
            w.synchronize()
    right = bool(np.array_equal(b.numpy(), np.arange(n, dtype=np.float32) + 100 * ((r - 1) % P)))
    out = (o.python_calls, len(batches), _C.device_native_p2p_count() - p2p0,
           _C.device_native_stream_count() - wrapped0, right)
    o.shutdown()
    return out
