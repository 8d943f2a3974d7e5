"""Rank side of test_kernel_call_check.py (apart from the test module, so that the ranks import
neither pytest nor the test modules): the kernel path's per-call host work, i.e. the call's
descriptor check inside the kernel (no host function per call) and the pooled completion events."""
import gc
import time

import numpy as np

import commlib
import commlib.emulated as emu
from commlib.core.call_spec import COLLECTIVE, DTYPE
from kernel_path_cases import KERNEL_SETTINGS, counted, per_path, with_settings

ALGORITHMS = ("direct", "two_shot", "ring", "recursive_doubling")


def _inputs(sub, n):
    """The inputs of _calls (made first: an emulated array's upload is itself a host function)."""
    xs = [emu.from_numpy(np.full(5 + i % 7, sub.rank + i, np.int32)) for i in range(n)]
    xs[-1].numpy()
    return xs


def _calls(sub, xs):
    """A small all_reduce of each input (algorithms rotating): whether every result was right."""
    ok, P = True, sub.size
    for i, x in enumerate(xs):
        sub.all_reduce(x, algorithm=ALGORITHMS[i % len(ALGORITHMS)])
        ok &= bool((x.numpy() == P * i + P * (P - 1) // 2).all())
    return ok


def _host_functions():
    return emu.rule_counts()["host_functions"]


def host_functions_per_call(comm, n=12):
    """(kernel path, copy path): (host functions the process enqueued during n calls, the paths the
    calls took, all results right)."""
    def run(sub):
        _calls(sub, _inputs(sub, 1))  # the engine's set-up is not per call
        xs = _inputs(sub, n)
        fns, ok = counted(_host_functions, lambda: _calls(sub, xs))
        return fns, sub._device().last_path(), ok
    return per_path(comm, run)


def events_per_call(comm, n=40):
    """Per path: (events the engine created for n calls after a warm-up, all right, the path the
    calls took), then the process's live emulated events after both sub-communicators closed, minus
    before."""
    gc.collect()
    alive = emu.rule_counts()["events_alive"]

    def run(sub):
        _calls(sub, _inputs(sub, 2))
        engine = sub._device()._last_engine
        xs = _inputs(sub, n)
        created, ok = counted(engine.events_created, lambda: _calls(sub, xs))
        return created, sub._device().last_path(), ok
    out = per_path(comm, run)
    gc.collect()
    return out, emu.rule_counts()["events_alive"] - alive


def mismatch_found_by_the_kernel(comm, scenario):
    """After a matched warm-up, every rank hides its kernel-path calls from the control plane (so
    the watchdog's comparison of published calls cannot see them) and makes a mismatched call:
    rank 0 another count (scenario "count") or a broadcast instead of an all_reduce ("collective").
    Returns (the error's type and message, seconds to it, seconds a later call took to raise)."""
    def run(sub):
        x = emu.from_numpy(np.ones(8, np.float32))
        sub.all_reduce(x, algorithm="direct")
        x.numpy()
        sub._device()._last_engine.hide_kernel_calls_from_control_plane()
        y = emu.from_numpy(np.ones(9 if (scenario == "count" and sub.rank == 0) else 8, np.float32))
        t = time.monotonic()
        try:
            if scenario == "collective" and sub.rank == 0:
                sub.broadcast(y, root=0, algorithm="direct", async_op=True).synchronize()
            else:
                sub.all_reduce(y, algorithm="direct", async_op=True).synchronize()
            return "no error", time.monotonic() - t, None
        except commlib.CommError as e:
            took, error = time.monotonic() - t, f"{type(e).__name__}: {e}"
        t = time.monotonic()
        try:
            sub.all_reduce(x, algorithm="direct")
            x.numpy()
            later = None
        except commlib.CommError:
            later = time.monotonic() - t
        return error, took, later
    return with_settings(comm, KERNEL_SETTINGS, run)


AUTO_COUNTS = (2, 16384, 65536, 262145)  # float32: 8 B, 64 KiB, 256 KiB, just over 1 MiB


def kernel_auto_choices(comm, settings, table=None, shareable=()):
    """What auto resolves an all_reduce of each of AUTO_COUNTS to under `settings` (and the tuning
    `table`, installed for the call and the default one put back after): on an engine that never
    connects (what the first call's descriptor is made with during set-up) and on the connected
    engine the calls run on; then the calls themselves: (before, after, the size policy's own
    choice on one host, the paths taken, all right, the algorithms the calls ran). The ranks in
    `shareable` call with buffers their peers can map (the others' have no shareable handle): the
    mapped two-shot is auto's only where every rank's are (policy/device_auto.h)."""
    from commlib import _C
    from commlib.core import tuning

    if table is not None:
        _C.clear_tuning()
        tuning.install(table)
        try:
            return kernel_auto_choices(comm, settings, None, shareable)
        finally:
            _C.clear_tuning()
            tuning.load_default()

    def run(sub):
        lone = _C.StreamEngine(sub._core, emu.device(0), 10.0, "never-connected")
        try:
            before = [lone.resolved_algorithm(COLLECTIVE["all_reduce"], "auto", n, DTYPE["float32"]) for n in AUTO_COUNTS]
        finally:
            lone.close()
            lone.release_memory(True)  # it never exported anything to a peer
        ok, paths, ran = True, [], []
        for n in AUTO_COUNTS:
            x = emu.from_numpy(np.full(n, sub.rank + 1, np.float32), shareable=sub.rank in shareable)
            sub.all_reduce(x)
            ok &= bool((x.numpy() == sub.size * (sub.size + 1) // 2).all())
            paths.append(sub._device().last_path())
            ran.append(sub._device()._last_engine.last_algorithm())
        engine = sub._device()._last_engine
        after = [engine.resolved_algorithm(COLLECTIVE["all_reduce"], "auto", n, DTYPE["float32"]) for n in AUTO_COUNTS]
        policy = [_C.resolve_algorithm(_C.Collective.all_reduce, "auto", n, 4, 0, sub.size, [], None)["algorithm"]
                  for n in AUTO_COUNTS]
        return before, after, policy, paths, ok, ran
    return with_settings(comm, settings, run)


def reduce_scatter_auto(comm, settings, shareable):
    """What an auto reduce_scatter ran, a 64 KiB and a just over 256 KiB output block on 3 ranks
    under `settings` (the ranks in `shareable` with buffers their peers can map), and whether the
    results were right: device auto takes the fused one-sided reduce_scatter where every rank's
    buffers are mapped and each rank reads more than 256 KiB of its peers (policy/device_auto.h)."""
    def run(sub):
        P, ran, ok = sub.size, [], True
        for n in (16384, 65537):
            x = emu.from_numpy(np.full(n * P, sub.rank + 1, np.float32), shareable=sub.rank in shareable)
            y = emu.from_numpy(np.zeros(n, np.float32), shareable=sub.rank in shareable)
            sub.reduce_scatter(y, x)
            ok &= bool((y.numpy() == P * (P + 1) // 2).all())
            ran.append(sub._device()._last_engine.last_algorithm())
        return ran, ok
    return with_settings(comm, settings, run)


def auto_against_fixed(comm, settings, shareable, counts):
    """Per count of float32 (random, seeded by rank: sums whose bits depend on the order), an auto
    all_reduce and the same call naming the algorithm auto ran, both out of place on buffers with
    (rank in `shareable`) or without a shareable handle: [(algorithm auto ran, whether the two
    results are bit for bit equal, the result's bytes' digest, staged bytes the kernel moved in the
    auto call, its one-sided handshakes per block)]. The digests are compared across ranks."""
    import hashlib

    def run(sub):
        out = []
        for n in counts:
            rng = np.random.default_rng(1000 * sub.rank + n)
            data = rng.standard_normal(n).astype(np.float32)
            results = []
            for algo in ("auto", None):
                x = emu.from_numpy(data.copy(), shareable=sub.rank in shareable)
                y = emu.from_numpy(np.zeros(n, np.float32), shareable=sub.rank in shareable)
                emu.synchronize()
                emu.kernel_counters(reset=True)
                sub.all_reduce(x, out=y, algorithm=algo or ran)
                emu.synchronize()
                if algo == "auto":
                    ran = sub._device()._last_engine.last_algorithm()
                    counters = emu.kernel_counters()
                results.append(y.numpy().tobytes())
            blocks = max(counters["block_runs"], 1)
            out.append((ran, results[0] == results[1], hashlib.sha256(results[0]).hexdigest(),
                        counters["staged_bytes"], counters["handshakes"] // blocks))
        return out
    return with_settings(comm, settings, run)


def broadcast_auto(comm, settings, counts):
    """Per count of float32 (rank 0 the root), what an auto broadcast resolves to on the host
    (the communicator's own resolution, the shipped tuning table) and on the device engine, what
    the device call ran, and whether every rank got the root's bytes."""
    from commlib import _C

    def run(sub):
        out = []
        for n in counts:
            host = _C.resolve_algorithm(_C.Collective.broadcast, "auto", n, 4, 0, sub.size, [], None)["algorithm"]
            x = emu.from_numpy(np.arange(n, dtype=np.float32) if sub.rank == 0 else np.zeros(n, np.float32))
            sub.broadcast(x, root=0)
            engine = sub._device()._last_engine
            device = engine.resolved_algorithm(COLLECTIVE["broadcast"], "auto", n, DTYPE["float32"])
            ok = bool((x.numpy() == np.arange(n, dtype=np.float32)).all())
            out.append((host, device, engine.last_algorithm(), sub._device().last_path(), ok))
        return out
    return with_settings(comm, settings, run)


def arena_lost(comm, count, calls=3):
    """An auto all_reduce of `count` float32 on buffers no rank can map, after rank 1's next device
    allocation was made to fail (emulated inject_fault "out_of_memory"): its first staged call cannot
    grow rank 1's staging arena, so pool staging turns off on every rank (kernel_path_arena.cc) and
    the call takes the slots' route. Per call: (algorithm run, right, digest); then this rank's arena bytes."""
    import hashlib

    def run(sub):
        warm = emu.from_numpy(np.ones(2, np.float32), shareable=False)
        sub.all_reduce(warm)  # the engine made and connected (its own allocations done)
        emu.synchronize()
        data = np.random.default_rng(sub.rank).integers(-1000, 1000, count).astype(np.float32)
        sub.barrier()
        if sub.rank == 1:
            emu.inject_fault(kind="out_of_memory")
        out = []
        for _ in range(calls):
            y = emu.from_numpy(data.copy(), shareable=False)
            sub.all_reduce(y)
            emu.synchronize()
            got = y.numpy()
            want = sum(np.random.default_rng(r).integers(-1000, 1000, count).astype(np.float32).astype(np.float64)
                       for r in range(sub.size))
            out.append((sub._device()._last_engine.last_algorithm(), bool((got == want).all()),
                        hashlib.sha256(got.tobytes()).hexdigest()))
        return out, sub._device()._last_engine.kernel_staging_arena()
    return with_settings(comm, {"COMMLIB_DEVICE_PATH": "auto"}, run)


def prepared_premul_sum_across_arena_changes(comm, count):
    """An auto premul_sum all_reduce of `count` float32 on buffers no rank can map: its scaled input
    is the engine's own copy, so it stages without agreeing a route, and from its second call on it
    is prepared (the bindings' call cache: the same buffer). Called twice; then an eager staged call
    grows the arena and it is called again; then rank 1's next allocation fails (emulated
    "out_of_memory") at a growth, so pool staging turns off on every rank, and it is called again,
    and once more on another buffer (not prepared: resolved for the route of now). Per call:
    (algorithm run, exact, digest); then the arena bytes after the growth and at the end."""
    import hashlib

    scale = 2.0  # exact on integers: every rank's scaled input, and their sum, are integers below 2**24
    want = sum(np.random.default_rng(r).integers(-1000, 1000, count).astype(np.float64) for r in range(comm.size)) * scale

    def run(sub):
        engine = None
        data = np.random.default_rng(sub.rank).integers(-1000, 1000, count).astype(np.float32)
        y = emu.from_numpy(data.copy(), shareable=False)
        out = []

        def premul_sum(buf):
            buf.copy_(emu.from_numpy(data, shareable=False))
            sub.all_reduce(buf, op="premul_sum", scale=scale)
            emu.synchronize()
            got = buf.numpy()
            out.append((engine.last_algorithm(), bool((got == want).all()), hashlib.sha256(got.tobytes()).hexdigest()))

        def grow():  # an auto call too large for the arena: it grows it (or falls back to the slots' choice)
            big = emu.from_numpy(np.ones(engine.kernel_staging_arena() // 4 + 4099, np.float32), shareable=False)
            sub.all_reduce(big)
            emu.synchronize()
            return bool((big.numpy() == sub.size).all())

        warm = emu.from_numpy(np.ones(2, np.float32), shareable=False)
        sub.all_reduce(warm)  # the engine made and connected (its own allocations done)
        engine = sub._device()._last_engine
        premul_sum(y)
        premul_sum(y)
        grown = grow()
        grown_bytes = engine.kernel_staging_arena()
        premul_sum(y)
        emu.synchronize()
        sub.barrier()
        if sub.rank == 1:
            emu.inject_fault(kind="out_of_memory")
        lost = grow()
        premul_sum(y)
        premul_sum(emu.from_numpy(data, shareable=False))
        return out, grown and lost, grown_bytes, engine.kernel_staging_arena()
    return with_settings(comm, {"COMMLIB_DEVICE_PATH": "auto"}, run)
