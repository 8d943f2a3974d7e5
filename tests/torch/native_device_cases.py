"""Rank side of test_cuda_p2p_emulated.py's C++-backend cases: the C++ backend's CUDA path
(csrc/torch_backend/device_calls.cc: ``device_run``, the core table's ``device_collective``, the
communicator's device call cache) driven with ``commlib.emulated`` memory through the backend's test
seam ``CommlibBackend._device_collective``, since torch's CPU build has no CUDA tensor. The seam
builds the call as the CUDA path does and runs the same entry; values are checked exactly.
"""
from __future__ import annotations

import collections

import numpy as np

import commlib.emulated as emu
from commlib import _C
from commlib.core.call_spec import COLLECTIVE, DTYPE, OP
from commlib.torch import native
from commlib.torch.backend import ProcessGroupCommlib


def _seam(backend, coll, count, a, b=None, root=0):
    """The CUDA path's entry for ``coll`` on float32 emulated arrays (b: the output side)."""
    return backend._device_collective(int(COLLECTIVE[coll]), int(DTYPE["float32"]), count, a.data_ptr(),
                                      (b if b is not None else a).data_ptr(), int(OP["sum"]), root, 1.0,
                                      b is not None, a.device_index, 0)


def cached_calls_run_from_cpp(comm):
    """The first call on the group and device sets its engine up from C++ and runs there (the
    Python route never sees it); the Python path then adopts that engine (no second set-up) and,
    once it ran a call (and so checked it), the same call runs from C++: all_reduce three times, an all_gather (two buffers), an all_to_all and a broadcast from the
    last rank; another count or root on that engine and stream runs from C++ too, as a new shape
    (native_new_shape_cases.py has the rest). Returns the failures (empty: all good)."""
    P, r = comm.size, comm.rank
    pg = ProcessGroupCommlib(comm.split(0), r, P)
    backend = native.wrap(pg)
    c, bad, n = pg._comm, [], 1000
    x = emu.from_numpy(np.full(n, r + 1, dtype=np.float32))
    first = _seam(backend, "all_reduce", n, x)
    if first is None:
        bad.append("the first all_reduce on the group and device was declined (C++ sets its engine up)")
    else:
        first.synchronize()
    c.all_reduce(x)  # the Python path: checks, enqueues, and adds the call to the cache
    if len(c._device()._setups.engines()) != 1:
        bad.append(f"engines set up: {len(c._device()._setups.engines())}, expected 1 (the route adopts C++'s)")
    _, hits0 = _C.device_native_counts()
    for k in range(3):
        w = _seam(backend, "all_reduce", n, x)
        if w is None:
            bad.append(f"all_reduce {k}: declined although the Python path ran that call")
            break
        w.wait()
        w.synchronize()
        if not w.is_completed():
            bad.append(f"all_reduce {k}: not completed after synchronize()")
    total = P * (P + 1) // 2 * P ** 4
    if not (x.numpy() == total).all():
        bad.append(f"all_reduce: {x.numpy()[:3]} expected {total}")
    if _C.device_native_counts()[1] - hits0 != 3:
        bad.append(f"C++ entry ran {_C.device_native_counts()[1] - hits0} calls, expected 3")
    # Another count on the engine and stream the route set up: a new shape, checked and resolved
    # in C++ (device_call_new_shape.cc), also run from C++.
    new0 = _C.device_native_new_shape_count()
    w = _seam(backend, "all_reduce", n - 1, x[0:n - 1])
    if w is None:
        bad.append("an all_reduce of another count was declined on a set-up engine and stream")
    else:
        w.synchronize()
        if not (x.numpy()[:n - 1] == total * P).all() or x.numpy()[n - 1] != total:
            bad.append(f"all_reduce of n - 1: {x.numpy()[-2:]} expected [{total * P}, {total}]")
    inp = emu.from_numpy(np.arange(7, dtype=np.float32) + 10 * r)
    out = emu.empty(7 * P, "float32")
    c.all_gather(out, inp)
    emu.current_stream().synchronize()
    inp.copy_(emu.from_numpy(np.arange(7, dtype=np.float32) + 100 * r))
    w = _seam(backend, "all_gather", 7, inp, out)
    if w is None:
        bad.append("all_gather: declined although the Python path ran that call")
    else:
        w.synchronize()
        want = np.concatenate([np.arange(7, dtype=np.float32) + 100 * q for q in range(P)])
        if not (out.numpy() == want).all():
            bad.append(f"all_gather: {out.numpy()} expected {want}")
    src = emu.from_numpy(np.arange(3 * P, dtype=np.float32) + 10 * r)
    dst = emu.empty(3 * P, "float32")
    c.all_to_all(dst, src)  # equal blocks: what all_to_all_single without split sizes runs
    src.copy_(emu.from_numpy(np.arange(3 * P, dtype=np.float32) + 100 * r))
    w = _seam(backend, "all_to_all", 3, src, dst)  # (the count: one block)
    if w is None:
        bad.append("all_to_all: declined although the Python path ran that call")
    else:
        w.synchronize()
        want = np.concatenate([np.arange(3 * r, 3 * r + 3, dtype=np.float32) + 100 * q for q in range(P)])
        if not (dst.numpy() == want).all():
            bad.append(f"all_to_all: {dst.numpy()} expected {want}")
    y = emu.from_numpy(np.full(5, r, dtype=np.float32))
    c.broadcast(y, root=P - 1)
    y.copy_(emu.from_numpy(np.full(5, 20 + r, dtype=np.float32)))
    w = _seam(backend, "broadcast", 5, y, root=0)  # another root: a new shape, from C++ too
    if w is None:
        bad.append("a broadcast from another root was declined on a set-up engine and stream")
    else:
        w.synchronize()
        if not (y.numpy() == 20).all():
            bad.append(f"broadcast from rank 0: {y.numpy()} expected 20")
    if _C.device_native_new_shape_count() - new0 != 2:
        bad.append(f"{_C.device_native_new_shape_count() - new0} new shapes ran from C++, expected 2")
    y.copy_(emu.from_numpy(np.full(5, 50 + r, dtype=np.float32)))
    w = _seam(backend, "broadcast", 5, y, root=P - 1)
    if w is None:
        bad.append("broadcast: declined although the Python path ran that call")
    else:
        w.synchronize()
        if not (y.numpy() == 50 + P - 1).all():
            bad.append(f"broadcast: {y.numpy()} expected {50 + P - 1}")
    pg.shutdown()
    return bad


def steady_cpp_calls_allocate_nothing(comm, n=200, kept=8):
    """n steady all_gathers through the C++ backend's CUDA entry (the seam), the caller holding its
    last `kept` works as a training step holds its buckets' (after 2 * kept held alike): the core's
    side (DeviceCallCache::run_native) re-arms a pooled DeviceWork that nobody owns any more instead
    of making one (bindings/device_work_pool.h, NativeWorkPool). (commlib's heap allocations on
    this thread in the n calls: _C.thread_allocations, which counts _C's code only; C++ entry hits;
    results right; the emulated driver calls of the n calls; and _C_torch's side of n more calls
    counted in C++: its allocations (the CudaWork re-armed from its pool, the held tensors in a
    ring), the calls run and the works pooled.)"""
    P, r = comm.size, comm.rank
    pg = ProcessGroupCommlib(comm.split(0), r, P)
    backend = native.wrap(pg)
    inp = emu.from_numpy(np.arange(7, dtype=np.float32) + 100 * r)
    out = emu.empty(7 * P, "float32")
    pg._comm.all_gather(out, inp)  # the Python path: checks, enqueues, caches
    held = collections.deque(maxlen=kept)
    for _ in range(2 * kept):
        held.append(_seam(backend, "all_gather", 7, inp, out))
    want = np.concatenate([np.arange(7, dtype=np.float32) + 100 * q for q in range(P)])

    def counted():
        """n calls, each counted alone, its work synchronized after it (uncounted): one call in
        flight at a time, so what the calls reference is the caller's `kept` works and the one in
        hand, as in the warm-up. (Unsynchronized, the host ran hundreds of calls ahead of the
        emulated device, as far as the machine's speeds let it, and the engine's queues doubled as
        many times as that lag took: CI's machine 8, this one 6.)"""
        hits = _C.device_native_counts()[1]
        allocs, calls = 0, collections.Counter()
        for _ in range(n):
            before = _C.emulated_thread_driver_calls()  # (its map is an allocation: outside the count)
            allocated = _C.thread_allocations()
            held.append(_seam(backend, "all_gather", 7, inp, out))
            allocs += _C.thread_allocations() - allocated
            after = _C.emulated_thread_driver_calls()
            calls.update({k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)})
            held[-1].synchronize()
        right = bool((out.numpy() == want).all()) and all(w.is_completed() for w in held)
        return allocs, _C.device_native_counts()[1] - hits, right, dict(calls)

    # Steady once what the calls use has grown to the machine's timing: on a loaded machine a call
    # may still find what an earlier one used not yet let go of (a descheduled thread: CI's, 2
    # allocations in one run, _C's side; here under three busy loops, _C_torch's side once in
    # about twenty), and a pool or queue then grows by one, for good; so
    # the n calls are counted again (at most twice more) while they allocated, and the last count
    # must be 0. A call that allocates on its own (a work made per call: 2n) allocates in every count.
    # The ranks agree on counting again (any rank allocated, none wrong): a rank that stopped alone
    # closed the group while its peer ran another count's calls (CI, once).
    def again(allocated, wrong=False):
        x = np.array([int(allocated > 0), int(wrong)], np.int64)
        comm.all_reduce(x, op="max")
        return bool(x[0]) and not x[1]

    for _ in range(3):
        allocs, hits, right, calls = counted()
        if not again(allocs, not right):
            break
    held.clear()
    # _C_torch's own side (#37: the CudaWork, the held tensors): the same calls in a C++ loop, counted
    # there (pybind11's conversions of a Python caller would count too), with the pool's size;
    # counted again alike while they allocated
    for _ in range(3):
        torch_allocs, ran = backend._device_collective_steady(n, kept, int(COLLECTIVE["all_gather"]),
                                                              int(DTYPE["float32"]), 7, inp.data_ptr(),
                                                              out.data_ptr(), True, inp.device_index, 0)
        if not again(torch_allocs):
            break
    right = right and bool((out.numpy() == want).all())
    pooled = backend._device_works_pooled()
    pg.shutdown()
    return allocs, hits, right, calls, (torch_allocs, ran, pooled)


P2P_DEVICE = 5  # a device no other case of the pool's processes sets up an engine on


def cpp_sends_and_receives(comm):
    """The CUDA path's sends and receives (held back in C++, issued as the engine's batches through
    the core's table): the first batch on a device sets its engine up from C++ and runs there; once
    the route ran a batch on this stream (adopting that engine),
    a receive-first ring and three messages per pair run from C++ in call order, exactly, one
    engine batch per round; and an uneven all_to_all_single (its own block copied, the rest one
    batch); and gather, scatter and a list all_to_all, one batch each. Returns the failures (empty:
    all good)."""
    P, r = comm.size, comm.rank
    nxt, prv = (r + 1) % P, (r - 1) % P
    pg = ProcessGroupCommlib(comm.split(0), r, P)
    backend = native.wrap(pg)
    c, bad, n = pg._comm, [], 64

    def ring(sends, recvs):
        """Receives then sends through the seam, on the default emulated stream; waits on all."""
        msgs = [(False, b.data_ptr(), b.nbytes, prv) for b in recvs] + [(True, a.data_ptr(), a.nbytes, nxt)
                                                                         for a in sends]
        works = backend._device_p2p(msgs, P2P_DEVICE, 0)
        for w in works:
            w.wait()
        for w in works:
            w.synchronize()

    a = emu.from_numpy(np.full(n, r, np.float32), device_index=P2P_DEVICE)
    b = emu.empty(n, "float32", device_index=P2P_DEVICE)
    before = _C.device_native_p2p_count()
    ring([a], [b])  # the first device call: the engine set up from C++, then the batch from C++
    if _C.device_native_p2p_count() - before != 1 or not (b.numpy() == prv).all():
        bad.append(f"first batch: {_C.device_native_p2p_count() - before} from C++, {b.numpy()[:3]} expected {prv}")
    c.batch_p2p([("recv", b, prv), ("send", a, nxt)])  # the Python path: adopts the engine, remembers the stream
    emu.current_stream(P2P_DEVICE).synchronize()
    before = _C.device_native_p2p_count()
    sends = [emu.from_numpy(np.arange(n, dtype=np.float32) + 100 * k + 10 * r, device_index=P2P_DEVICE)
             for k in range(3)]
    recvs = [emu.empty(n, "float32", device_index=P2P_DEVICE) for _ in range(3)]
    ring(sends[:1], recvs[:1])
    ring(sends, recvs)  # three per pair: rounds 1..3 in call order
    for k in range(3):
        want = np.arange(n, dtype=np.float32) + 100 * k + 10 * prv
        if not (recvs[k].numpy() == want).all():
            bad.append(f"message {k} from rank {prv}: {recvs[k].numpy()[:3]} expected {want[:3]}")
    if _C.device_native_p2p_count() - before != 4:
        bad.append(f"C++ enqueued {_C.device_native_p2p_count() - before} point-to-point batches, expected 4")
    # An uneven all_to_all_single (split sizes): rank r sends rank j r + j + 1 floats, one batch.
    src = emu.from_numpy(np.concatenate([np.arange(r + j + 1, dtype=np.float32) + 1000 * r + 100 * j
                                         for j in range(P)]), device_index=P2P_DEVICE)
    dst = emu.from_numpy(np.full(sum(q + r + 1 for q in range(P)), -1, np.float32), device_index=P2P_DEVICE)
    emu.current_stream(P2P_DEVICE).synchronize()  # (the seam's own block is copied by the host)
    before = _C.device_native_p2p_count()
    w = backend._device_exchange(src.data_ptr(), dst.data_ptr(), [4 * (r + j + 1) for j in range(P)],
                                 [4 * (q + r + 1) for q in range(P)], P2P_DEVICE, 0)
    w.wait()
    w.synchronize()
    want = np.concatenate([np.arange(q + r + 1, dtype=np.float32) + 1000 * q + 100 * r for q in range(P)])
    if not (dst.numpy() == want).all():
        bad.append(f"uneven all_to_all: {dst.numpy()} expected {want}")
    if _C.device_native_p2p_count() - before != 1:
        bad.append(f"uneven all_to_all: {_C.device_native_p2p_count() - before} batches from C++, expected 1")
    _list_calls(backend, P, r, bad)
    pg.shutdown()
    return bad


def _list_calls(backend, P, r, bad):
    """gather (to the last rank), scatter (from rank 0) and a list all_to_all of uneven blocks, each
    as the CUDA path's one batch from C++ (the device route has run a batch on this stream): exact
    values, this rank's own block included, and one engine batch each."""
    dev, f32 = P2P_DEVICE, np.float32

    def blocks(arrays):
        return [(a.data_ptr(), a.nbytes) for a in arrays]

    def run(kind, ins, outs, root=0):
        emu.current_stream(dev).synchronize()  # (the seam's own block is copied by the host)
        before = _C.device_native_p2p_count()
        w = backend._device_list_call(kind, blocks(ins), blocks(outs), root, dev, 0)
        w.wait()
        w.synchronize()
        if _C.device_native_p2p_count() - before != 1:
            bad.append(f"{kind}: {_C.device_native_p2p_count() - before} batches from C++, expected 1")

    root = P - 1
    mine = emu.from_numpy(np.arange(5, dtype=f32) + 10 * r, device_index=dev)
    listed = [emu.from_numpy(np.full(5, -1, f32), device_index=dev) for _ in range(P)] if r == root else []
    run("gather", [mine], listed, root)
    for q, got in enumerate(a.numpy() for a in listed):
        if not (got == np.arange(5, dtype=f32) + 10 * q).all():
            bad.append(f"gather: block {q} is {got}")
    to_send = [emu.from_numpy(np.arange(3, dtype=f32) + 1000 + 10 * j, device_index=dev)
               for j in range(P)] if r == 0 else []
    got = emu.from_numpy(np.full(3, -1, f32), device_index=dev)
    run("scatter", to_send, [got], 0)
    if not (got.numpy() == np.arange(3, dtype=f32) + 1000 + 10 * r).all():
        bad.append(f"scatter: {got.numpy()} expected block {r}")
    # rank r sends rank j r + 2j + 1 floats
    ins = [emu.from_numpy(np.arange(r + 2 * j + 1, dtype=f32) + 1000 * r + 100 * j, device_index=dev)
           for j in range(P)]
    outs = [emu.from_numpy(np.full(q + 2 * r + 1, -1, f32), device_index=dev) for q in range(P)]
    run("all_to_all", ins, outs)
    for q in range(P):
        want = np.arange(q + 2 * r + 1, dtype=f32) + 1000 * q + 100 * r
        if not (outs[q].numpy() == want).all():
            bad.append(f"list all_to_all: from rank {q} {outs[q].numpy()} expected {want}")


def held_flush_lets_the_gil_go(comm):
    """A thread that holds the GIL and flushes held sends and receives (torch's binding of
    Work.is_completed keeps the GIL) while another thread holds the hold's mutex and waits for the GIL (a first CUDA batch
    going through Python, python_batch, or setting the engine up from C++ through a store's Python
    object; here the seam that does what it does): the first lets the GIL go while it waits for the
    mutex, so both finish, and the flush (the first device call: the set-up from C++, which takes the
    GIL for the store under the mutex) runs the ring. Returns what the flushed receive's
    synchronize() raised or got wrong ("" when right) and whether the holder finished."""
    import sys
    import threading
    P, r = comm.size, comm.rank
    pg = ProcessGroupCommlib(comm.split(0), r, P)
    backend = native.wrap(pg)
    b = emu.empty(16, "float32", device_index=P2P_DEVICE)
    a = emu.from_numpy(np.full(16, r, np.float32), device_index=P2P_DEVICE)
    w, _ = backend._device_p2p([(False, b.data_ptr(), b.nbytes, (r + 1) % P), (True, a.data_ptr(), a.nbytes, (r - 1) % P)],
                               P2P_DEVICE, 0)
    inside, go = threading.Event(), threading.Event()

    def under_the_mutex():  # holds the mutex; lets the GIL go until the main thread flushes
        inside.set()
        go.wait()

    holder = threading.Thread(target=backend._while_holding_p2p, args=(under_the_mutex,), daemon=True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # the main thread keeps the GIL from go.set() into get_future()
    try:
        holder.start()
        inside.wait()
        go.set()
        done = w.is_completed()  # flushes the held receive, holding the GIL (it fails: complete)
    finally:
        sys.setswitchinterval(switch)
    holder.join(30)
    try:
        w.synchronize()
        seen = "" if (b.numpy() == (r + 1) % P).all() else f"received {b.numpy()[:3]} (is_completed: {done})"
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        seen = str(e)
    pg.shutdown()
    return seen, not holder.is_alive()


FAULT_DEVICE = 6  # a device of its own: the fault is sticky for the rest of the pool process's life


def device_fault_raises_through_cpp(comm, victim=1):
    """A device fault on one rank (emulated.inject_fault) after a call is cached: the next call
    offered through the C++ entry raises commlib's CommError there (from the offer or from its
    work's synchronize()), never a crash; every rank's group shuts down. Returns (kind, message) of
    the error this rank saw (None on the others)."""
    P, r = comm.size, comm.rank
    pg = ProcessGroupCommlib(comm.split(0), r, P)
    backend = native.wrap(pg)
    x = emu.from_numpy(np.ones(64, np.float32), device_index=FAULT_DEVICE)
    pg._comm.all_reduce(x)
    w = _seam(backend, "all_reduce", 64, x)
    w.synchronize()
    comm.barrier()
    seen = None
    if r == victim:
        emu.inject_fault(FAULT_DEVICE, "illegal_address")
        try:
            w = _seam(backend, "all_reduce", 64, x)
            if w is not None:
                w.synchronize()
            seen = ("no error", "")
        except Exception as e:  # noqa: BLE001 - the kind is what the test checks
            seen = (type(e).__name__, str(e))
    comm.barrier()
    try:
        pg.shutdown()
    except Exception:  # noqa: BLE001 - the victim's shutdown may report the failed engine again
        pass
    return seen
