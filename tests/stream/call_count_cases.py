"""Rank side of test_call_counts.py: the driver calls steady device collectives make on the
caller's thread (issue #37, items 1 and 5), counted by the emulated device
(``_C.emulated_thread_driver_calls``: this thread's calls, with its device guards' gets and sets;
the watchdog's are its own thread's). After a few drained warm-up calls, N calls run back to back
inside one count (the steady state: the next call retires the previous ones by their done words),
then drain outside it."""
import collections
import weakref

import numpy as np

import commlib._C as _C
import commlib.emulated as emu
from fast_device_call_cases import collective_calls
from kernel_path_cases import KERNEL_SETTINGS, with_settings


def _diff(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def _counted(fn):
    """(driver calls fn() made on this thread, C++ entry hits, fn's result, heap allocations of
    commlib's C++ code on this thread: _C.thread_allocations, csrc/common/alloc_count.h)."""
    hits = _C.device_fast_path_counts()[1]
    before = _C.emulated_thread_driver_calls()  # (its map is an allocation: outside the count)
    allocs = _C.thread_allocations()
    result = fn()
    allocs = _C.thread_allocations() - allocs
    after = _C.emulated_thread_driver_calls()
    return _diff(before, after), _C.device_fast_path_counts()[1] - hits, result, allocs


def _drain(works=()):
    for w in works:
        if w is not None:
            w.synchronize()
    emu.current_stream().synchronize()


# Async works a steady caller holds at once (its last KEPT calls'), as a training step holds the
# works of its buckets: the C++ entry's pool of handles grows to what is held, then every call
# re-arms one the caller let go of (csrc/bindings/device_work_pool.h).
KEPT = 8


def steady_call_counts(comm, n=1000, wrap=None, names=None):
    """{(collective, "blocking"|"async"): (driver calls of n steady calls, hits, results right,
    path, C++ heap allocations)} on the kernel path, after three drained warm-up calls (the first
    fills the cache and sets the engine up) and 2 * KEPT calls held as the counted ones are (the
    caller holding its last KEPT works); ``wrap``: as collective_calls' (another library's view
    of each array), ``names``: the collectives to count (default: all)."""
    def run(sub):
        out = {}
        for name, (call, check) in collective_calls(sub, wrap=wrap).items():
            if names is not None and name not in names:
                continue
            for mode in ("blocking", "async"):
                a = mode == "async"
                for _ in range(3):
                    _drain([call(a, None)])
                held = collections.deque(maxlen=KEPT)

                def issue(k):
                    for _ in range(k):
                        held.append(call(a, None))
                issue(2 * KEPT)
                calls, hits, _, allocs = _counted(lambda: issue(n))
                _drain(held)
                held.clear()
                out[(name, mode)] = (calls, hits, bool(check()), sub._device().last_path(), allocs)
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def asked_call_counts(comm, n=20):
    """all_reduce on the kernel path: the driver calls of what asks more than a steady call: n
    works' wait() on another stream, n calls alternating between two streams, n works'
    synchronize() and is_completed(), and n avg calls (a divide after the launch); with whether
    the results were right."""
    def run(sub):
        P = sub.size
        x = emu.from_numpy(np.ones(4, np.float32))
        other = emu.Stream()
        out = {}
        for _ in range(3):
            _drain([sub.all_reduce(x, async_op=True)])
            _drain([sub.all_reduce(x, async_op=True, stream=other)])
            other.synchronize()
            _drain([sub.all_reduce(x, op="avg")])
        works = [sub.all_reduce(x, async_op=True) for _ in range(n)]
        out["wait"] = _counted(lambda: [w.wait(stream=other) for w in works])[:2]
        _drain(works)
        other.synchronize()

        def alternate():
            for i in range(n):
                sub.all_reduce(x, stream=other if i % 2 else None)
        out["alternate"] = _counted(alternate)[:2]
        other.synchronize()
        _drain()
        works = [sub.all_reduce(x, async_op=True) for _ in range(n)]
        out["synchronize"] = _counted(lambda: [w.synchronize() for w in works])[:2]
        out["is_completed"] = _counted(lambda: [w.is_completed() for w in works])[:2]
        out["avg"] = _counted(lambda: [sub.all_reduce(x, op="avg") for _ in range(n)])[:2]
        _drain()
        v = x.numpy()
        out["right"] = bool(np.isfinite(v).all() and (v == v[0]).all() and v[0] == float(P) ** (6 + 3 * n))
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def pooled_handles(comm, n=20):
    """The C++ entry's pooled async handles (csrc/bindings/device_work_pool.h), all_reduce on the
    kernel path: a work the caller holds while n later async calls come and go (each let go of at
    once, so the pool re-arms one handle for them) keeps its own handle and call number; the later
    calls' numbers follow one another; and a work kept past the communicator's close still
    answers (its handle holds the engine); a handle with a weak reference to it is not re-armed. (held
    kept its handle and number, numbers in order, the observed handle not re-armed, the
    kept-past-close work's synchronize() and is_completed(), results right.)"""
    P = None

    def run(sub):
        nonlocal P
        P = sub.size
        x = emu.from_numpy(np.ones(4, np.float32))
        for _ in range(3):
            _drain([sub.all_reduce(x, async_op=True)])
        held = sub.all_reduce(x, async_op=True)
        handle, number = held._work, held._work.seq
        numbers = []
        for _ in range(n):
            numbers.append(sub.all_reduce(x, async_op=True)._work.seq)
        kept_own = held._work is handle and held._work.seq == number
        held.synchronize()
        in_order = numbers == list(range(number + 1, number + n + 1))
        # A handle somebody observes (a weak reference) is never re-armed: once let go of, it
        # leaves the pool and dies as an unpooled one would, so its observer never sees it answer
        # for a later call.
        w = sub.all_reduce(x, async_op=True)
        observer, seen = weakref.ref(w._work), w._work.seq
        del w
        for _ in range(4):
            sub.all_reduce(x, async_op=True)
        unseen = observer() is None or observer().seq == seen
        last = sub.all_reduce(x, async_op=True)
        sub.close()
        return kept_own, in_order, unseen, last, x
    kept_own, in_order, unseen, last, x = with_settings(comm, KERNEL_SETTINGS, run)
    last.synchronize()
    done = last.is_completed()
    return kept_own, in_order, unseen, done, bool((x.numpy() == float(P) ** (3 + 1 + n + 1 + 4 + 1)).all())


def steady_calls_cuda(comm, n=1000):
    """On GPU 0 with torch (the done word on a real device): n steady blocking and n async 8-float
    all_reduces through the C++ entry (the async ones' last KEPT works held, after 2 * KEPT held
    alike), then a work waited on by another stream: (hits, commlib's heap allocations in the n
    blocking calls and in the n async ones, results right, the other stream saw the result)."""
    import torch
    from commlib.settings import overridden
    with overridden(KERNEL_SETTINGS):
        sub = comm.split(0, timeout=60)
    try:
        dev = torch.device("cuda", 0)
        x = torch.ones(8, device=dev)
        for _ in range(3):  # warm with the measured call itself: another op is another cache entry
            sub.all_reduce(x, op="max")
        torch.cuda.synchronize()
        hits = _C.device_fast_path_counts()[1]
        allocs = _C.thread_allocations()
        for _ in range(n):
            sub.all_reduce(x, op="max")
        allocs = _C.thread_allocations() - allocs
        held = collections.deque(maxlen=KEPT)
        for _ in range(2 * KEPT):
            held.append(sub.all_reduce(x, op="max", async_op=True))
        async_allocs = _C.thread_allocations()
        for _ in range(n):
            held.append(sub.all_reduce(x, op="max", async_op=True))
        async_allocs = _C.thread_allocations() - async_allocs
        hits = _C.device_fast_path_counts()[1] - hits
        held[-1].synchronize()
        right = bool((x == 1.0).all().item()) and all(w.is_completed() for w in held)
        held.clear()
        y = torch.full((8,), float(sub.rank + 1), device=dev)
        w = sub.all_reduce(y, async_op=True)
        other = torch.cuda.Stream(dev)
        with torch.cuda.stream(other):
            w.wait()  # the other stream waits on the done word (cuStreamWaitValue64)
            seen = y.clone()
        other.synchronize()
        expect = sum(range(1, sub.size + 1))
        return hits, allocs, async_allocs, right, bool((seen == expect).all().item())
    finally:
        sub.close()


def plan_lookups(comm, n=20):
    """{(collective, "blocking"|"async"): (the kernel path's device-plan lookups in n steady calls,
    C++ entry hits)} after three drained warm-up calls, and {"new shape": lookups of one call of a
    shape not run before} (the counter counts)."""
    def run(sub):
        out = {}
        engine = None
        for name, (call, _) in collective_calls(sub).items():
            for mode in ("blocking", "async"):
                a = mode == "async"
                for _ in range(3):
                    _drain([call(a, None)])
                engine = sub._device()._last_engine
                before, hits = engine.kernel_plan_lookups(), _C.device_fast_path_counts()[1]
                works = [call(a, None) for _ in range(n)]
                out[(name, mode)] = (engine.kernel_plan_lookups() - before, _C.device_fast_path_counts()[1] - hits)
                _drain(works)
        before = engine.kernel_plan_lookups()
        sub.all_reduce(emu.from_numpy(np.ones(5, np.float32)))
        _drain()
        out["new shape"] = engine.kernel_plan_lookups() - before
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def completion_events(comm, n=10):
    """all_reduce on the kernel path: (the driver calls of n works' completion_event(), whether a
    stream made to wait on the event, by emulated.Stream.wait_event and by the event's wait(), saw
    the call's result (a copy enqueued there right after, the emulated delay on), whether the events
    then said complete)."""
    def run(sub):
        P = sub.size
        x = emu.from_numpy(np.ones(4, np.float32))
        for _ in range(3):
            _drain([sub.all_reduce(x, async_op=True)])
        works = [sub.all_reduce(x, async_op=True) for _ in range(n)]
        calls = _counted(lambda: [w.completion_event() for w in works])[0]
        _drain(works)
        other, seen, done = emu.Stream(), [], []
        for way in ("stream.wait_event", "event.wait"):
            y = emu.from_numpy(np.full(1024, sub.rank + 1.0, np.float32))
            w = sub.all_reduce(y, async_op=True)
            ev = w.completion_event()
            if way == "event.wait":
                ev.wait(other)
            else:
                other.wait_event(ev)
            out = emu.empty(1024, stream=other)
            out.copy_(y, stream=other)
            other.synchronize()
            seen.append(bool((out.host_view_unsynchronized() == P * (P + 1) / 2).all()))
            ev.synchronize()
            done.append(ev.query() and ev.handle != 0)
            w.synchronize()
        return calls, seen, done
    return with_settings(comm, KERNEL_SETTINGS, run)


MAPPED_CANDIDATE = 65600  # float32 elements: just over 256 KiB, where auto maps at 2 ranks (device_auto.h)


def mapped_candidate_lookups(comm, n=5):
    """An auto all_reduce that may take the mapped two-shot (its route agreed per call), through
    the C++ entry: {route: (the kernel path's device-plan lookups and the engine's plan-cache
    lookups in n steady calls, C++ entry hits, the algorithm run, results right)}, where every
    rank's buffer can be mapped ("mapped") and where rank 1's cannot ("staged")."""
    def run(sub):
        out = {}
        for route in ("mapped", "staged"):
            x = emu.from_numpy(np.ones(MAPPED_CANDIDATE, np.float32), shareable=route == "mapped" or sub.rank != 1)
            for _ in range(2):
                sub.all_reduce(x)
                _drain()
            engine = sub._device()._last_engine
            before = engine.kernel_plan_lookups(), engine.plan_cache_lookups(), _C.device_fast_path_counts()[1]
            for _ in range(n):
                sub.all_reduce(x)
            _drain()
            after = engine.kernel_plan_lookups(), engine.plan_cache_lookups(), _C.device_fast_path_counts()[1]
            right = bool((x.numpy() == float(sub.size) ** (2 + n)).all())
            out[route] = (after[0] - before[0], after[1] - before[1], after[2] - before[2], engine.last_algorithm(),
                          right)
        return out
    # Slots of 64 KiB: the staged two-shot's 128 KiB per peer in 2 chunks, not 32 (test time).
    return with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="65536"), run)


# host_reads: besides the abort polls (abort_polls, which count as host reads too: how many a wait
# makes depends on how long it spins, so they are pinned apart, by late_peer_polls).
LAUNCH_COUNTERS = ("message_blocks", "grid_barriers", "check_exchanges", "folded_checks", "peer_waits", "host_reads",
                   "host_writes")


def launch_counts(comm, cases, n=5):
    """Per case (algorithm, float32 count) of all_reduce on the kernel path: what the emulated device
    counted of one launch (kernel counters over n steady calls, after warm-up calls, divided by the
    launches: {counter: per launch} for LAUNCH_COUNTERS), and whether the results were right."""
    def run(sub):
        out = {}
        for algo, count in cases:
            x = emu.from_numpy(np.ones(count, np.float32))
            for _ in range(3):
                sub.all_reduce(x, algorithm=algo)
            _drain()
            emu.kernel_counters(reset=True)
            for _ in range(n):
                sub.all_reduce(x, algorithm=algo)
            _drain()
            c = emu.kernel_counters(reset=True)
            c["host_reads"] -= c["abort_polls"]
            right = bool((x.numpy() == float(sub.size) ** (3 + n)).all())
            launches = c["message_launches"]
            out[(algo, count)] = ({k: c[k] / launches for k in LAUNCH_COUNTERS} if launches == n else launches, right)
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def late_peer_polls(comm, cases, late_s=0.2):
    """Per case (algorithm, float32 count) of all_reduce on the kernel path, with the last rank
    `late_s` late to the call (its peers' launches wait for it, polling the abort word): this rank's
    (abort polls, host reads) of that one call, and whether the result was right."""
    import time

    def run(sub):
        out = {}
        for algo, count in cases:
            x = emu.from_numpy(np.ones(count, np.float32))
            sub.all_reduce(x, algorithm=algo)
            _drain()
            sub.barrier()
            emu.kernel_counters(reset=True)
            if sub.rank == sub.size - 1:
                time.sleep(late_s)
            sub.all_reduce(x, algorithm=algo)
            _drain()
            c = emu.kernel_counters(reset=True)
            out[(algo, count)] = (c["abort_polls"], c["host_reads"], bool((x.numpy() == float(sub.size) ** 2).all()))
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)


def copy_recv_counts(comm, setting):
    """COMMLIB_DEVICE_COPY_RECV=`setting` (None: unset, the default) on the copy path (docs/gpu.md
    "The copy path's large-message regression"): the driver calls one ring all_reduce and one ring
    all_gather (4 floats per rank) make on this thread, and whether both results are right; then the
    same under gated (no copy of the stop word), the baseline."""
    from kernel_path_cases import COPY_SETTINGS

    def run(sub):
        calls = collective_calls(sub)
        counts, _, _, _ = _counted(lambda: [calls[name][0](False, None) for name in ("all_reduce", "all_gather")])
        _drain()
        return counts, all(calls[name][1]() for name in ("all_reduce", "all_gather"))

    def settings(s):
        chosen = {} if s is None else {"COMMLIB_DEVICE_COPY_RECV": s}
        return dict(COPY_SETTINGS, **chosen, COMMLIB_ALGO_ALL_REDUCE="ring", COMMLIB_ALGO_ALL_GATHER="ring")
    return [with_settings(comm, settings(s), run) for s in (setting, "gated")]


MAPPED_ALGORITHMS = ("mapped_one_shot", "mapped_two_shot", "mapped_fused_two_shot")


def mapped_steady_counts(comm, n=40, count=1024):
    """The one-sided all_reduces (csrc/stream/stream_one_sided.cc: every call agrees on its route
    with the peers, PeerBuffers::agree), in place on `count` float32, n steady calls back to back
    through the C++ entry: {(algorithm, "array"|"pool"): (driver calls on this thread, C++ entry
    hits, agreement waits, results right, heap allocations of commlib's C++ code on this thread, sleeps
    of the agreement's wait: PeerBuffers::back_off)} for a commlib.emulated array (cudaMalloc'd memory: its
    registration checked per call) and a symmetric pool block (commlib.device.empty: its arena
    mapped when made)."""
    import commlib.device as cdev

    def run(sub):
        out = {}
        engine = None
        for algo in MAPPED_ALGORITHMS:
            for kind in ("array", "pool"):
                if kind == "array":
                    x = emu.from_numpy(np.ones(count, np.float32))
                else:
                    x = cdev.empty(count, "float32", comm=sub, device="emulated")
                    x.copy_(emu.from_numpy(np.ones(count, np.float32)))
                for _ in range(3):
                    sub.all_reduce(x, algorithm=algo)
                _drain()
                engine = sub._device()._last_engine
                before = engine.peer_buffer_stats()
                calls, hits, _, allocs = _counted(lambda: [sub.all_reduce(x, algorithm=algo) for _ in range(n)])
                _drain()
                right = bool((x.numpy() == float(sub.size) ** (3 + n)).all())
                after = engine.peer_buffer_stats()
                out[(algo, kind)] = (calls, hits, after["waits"] - before["waits"], right, allocs,
                                     after["agree_sleeps"] - before["agree_sleeps"])
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)
