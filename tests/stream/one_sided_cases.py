"""What the one-sided kernel-path tests (test_one_sided_kernel.py) run in the rank processes: the
mapped algorithms over the staged path, with settings that make several blocks (per-block flags)
and small slots (the staging area) matter. Apart from the test module so that ranks do not import
pytest."""
import device_cases
from kernel_path_cases import KERNEL_SETTINGS, with_settings

ONE_SIDED = [("all_reduce", "mapped_one_shot"), ("all_reduce", "mapped_two_shot"),
             ("all_reduce", "mapped_fused_two_shot"), ("all_gather", "mapped"),
             ("reduce_scatter", "mapped"), ("reduce_scatter", "mapped_fused"), ("all_to_all", "mapped")]
# 64 bytes per block per handshake: the emulated device's 4 blocks from a few hundred bytes on, so
# the shares, the per-block flags and the awkward tails all run; 8 KiB slots x 2 per peer stage.
SETTINGS = dict(KERNEL_SETTINGS, COMMLIB_DEVICE_BLOCK_BYTES="64", COMMLIB_DEVICE_SLOT_BYTES="8192")


# The routes of the matrix's calls: every rank's buffers shareable (mapped in place), or none
# (staged: in the staging arena, COMMLIB_DEVICE_STAGING=pool, or through the slots).
ROUTES = ("mapped", "arena", "slots")


def one_sided_matrix(comm, cases):
    """(failures, digests, paths, {route: counters of its calls}) for `cases`, [(route, case)], each
    route's on a kernel-path sub-communicator of its own settings (arena and mapped share one)."""
    import commlib.emulated as emu

    def run(sub, routes):
        fails, digests, paths, counters = [], [], set(), {}
        for route in routes:
            emu.synchronize()
            emu.kernel_counters(reset=True)
            device_cases.SHAREABLE = route == "mapped"
            try:
                for c in [c for r, c in cases if r == route]:
                    f, d = device_cases.check_cases(sub, [c])
                    fails += f
                    digests += d
                    paths.add(sub._device_route.last_path())
            finally:
                device_cases.SHAREABLE = True
            emu.synchronize()
            counters[route] = emu.kernel_counters()
        return fails, digests, paths, counters
    f1, d1, p1, c1 = with_settings(comm, SETTINGS, run, ("mapped", "arena"))
    f2, d2, p2, c2 = with_settings(comm, dict(SETTINGS, COMMLIB_DEVICE_STAGING="slots"), run, ("slots",))
    return f1 + f2, d1 + d2, sorted(p1 | p2), dict(c1, **c2)


def counted_call(comm, coll, algo, count, settings, shareable=True):
    """One warm-up and one counted call of `algo` with `count` float32 elements per rank block:
    (the counters of the second call, whether the result was right). `shareable` False: the
    buffers have no shareable handle (the staged path)."""
    import numpy as np

    import commlib.emulated as emu

    def run(sub):
        P, r = sub.size, sub.rank
        n_in = count * (P if coll in ("reduce_scatter", "all_to_all") else 1)
        n_out = count * (P if coll in ("all_gather", "all_to_all") else 1)
        x = emu.from_numpy(np.full(n_in, r + 1, np.float32), shareable=shareable)
        y = emu.from_numpy(np.zeros(n_out, np.float32), shareable=shareable)
        call = getattr(sub, coll)
        for i in range(2):
            if i == 1:  # the warm-up's launch done (calls are stream-ordered, not host-synchronous)
                emu.synchronize()
                emu.kernel_counters(reset=True)
            if coll == "all_reduce":
                call(x, out=y, algorithm=algo)
            else:
                call(y, x, algorithm=algo)  # (output, input)
        emu.synchronize()
        counters = emu.kernel_counters()
        got = y.numpy()
        want = {"all_reduce": P * (P + 1) / 2, "reduce_scatter": P * (P + 1) / 2}.get(coll)
        ok = bool(np.all(got == want)) if want is not None else got[0] == 1 and got[-1] == P
        return counters, ok
    return with_settings(comm, dict(KERNEL_SETTINGS, **settings), run)


def refusals(comm):
    """The messages of a one-sided call refused: on the copy path, and too big for the staging slots
    (buffers without a shareable handle: staged), then a fitting call on the same communicator
    still runs, and the same too-big call on buffers every rank can map runs (nothing staged):
    (on_copy, too_big, then, mapped)."""
    import numpy as np

    import commlib.emulated as emu
    from kernel_path_cases import COPY_SETTINGS

    def attempt(sub, n, shareable=False):
        x = emu.from_numpy(np.ones(n, np.float32), shareable=shareable)
        try:
            sub.all_reduce(x, algorithm="mapped_two_shot")
            emu.synchronize()
        except ValueError as e:
            return str(e)
        return float(x.numpy()[0])
    on_copy = with_settings(comm, COPY_SETTINGS, attempt, 16)
    small = dict(SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="4096", COMMLIB_DEVICE_STAGING="slots")
    too_big, then, mapped = with_settings(comm, small, lambda sub: (attempt(sub, 8192), attempt(sub, 64),
                                                                    attempt(sub, 8192, True)))
    return on_copy, too_big, then, mapped


def at_the_slots_limit(comm):
    """mapped_one_shot (only its input is read at peers: the output is never staged) with a staged
    need at the slots area's bytes (2 ranks x 2 slots x 4 KiB = 16 KiB): exactly, just under (its
    output's offset rounds up to the end), just over; each on buffers no rank can map (staged) and
    on buffers every rank maps (the plan's staged table is built at its upload on either route).
    Per call: the result, or the refusal ("ValueError: ..."; any other error as its type and
    message), then whether a small call still runs on the same communicator."""
    import numpy as np

    import commlib.emulated as emu

    def attempt(sub, n, shareable):
        x = emu.from_numpy(np.ones(n, np.float32), shareable=shareable)
        try:
            sub.all_reduce(x, algorithm="mapped_one_shot")
            emu.synchronize()
        except Exception as e:  # noqa: BLE001 - the test names what was raised
            return f"{type(e).__name__}: {e}"
        return float(x.numpy()[0])

    small = dict(SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="4096", COMMLIB_DEVICE_STAGING="slots")
    limit = 2 * 2 * 4096 // 4  # float32 elements filling the slots area
    return with_settings(comm, small, lambda sub: [
        (n, shareable, attempt(sub, n, shareable), attempt(sub, 16, False))
        for shareable in (False, True) for n in (limit, limit - 1, limit + 1)])


def arena_growth(comm):
    """COMMLIB_DEVICE_STAGING=pool (the default) with 4 KiB slots (16 KiB in all at 2 ranks), buffers
    no rank can map (staged): mapped_fused_two_shot far beyond the slots runs in the staging arena,
    which grows when a call needs more than it holds and not otherwise. Per call: (elements, the
    result, the arena's bytes after it, staged bytes, handshakes per block); then the exported memory freed
    while a peer still mapped it, counted once the communicator closed (the arenas are freed only
    after every peer closed its imports), and whether the registry's wait per growth was the only
    one (one per agreed call plus one per growth)."""
    import commlib.emulated as emu
    from commlib.settings import overridden

    freed_while_mapped = emu.rule_counts()["exports_freed_while_mapped"]
    with overridden(dict(SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="4096")):  # read when the engine is made
        sub = comm.split(0, timeout=60)
        calls = _arena_calls(sub)
        waits = sub._device_route._last_engine.peer_buffer_stats()["waits"]
        sub.close()
    return calls, emu.rule_counts()["exports_freed_while_mapped"] - freed_while_mapped, waits


def _arena_calls(sub):
    import numpy as np

    import commlib.emulated as emu

    calls = []
    for n in (8192, 1 << 19, 64, 1 << 19):
        x = emu.from_numpy(np.full(n, sub.rank + 1, np.float32), shareable=False)
        emu.synchronize()
        emu.kernel_counters(reset=True)
        sub.all_reduce(x, algorithm="mapped_fused_two_shot")
        got = x.numpy()
        c = emu.kernel_counters()
        ok = bool(np.all(got == sub.size * (sub.size + 1) / 2))
        engine = sub._device_route._last_engine
        calls.append((n, ok, engine.kernel_staging_arena(), c["staged_bytes"], c["handshakes"] / c["block_runs"]))
    return calls


# test_one_sided_kernel.py's grid cases: every one-sided algorithm at a count whose every handshake
# wants more than 20 blocks of SETTINGS' 64 bytes (so the grid is the SM count), not a multiple of
# the blocks' 64-byte lines (uneven shares, predicated tails), on a shareable and an unshareable
# float32 buffer (mapped and arena routes), float32 and bfloat16 in turn.
GRID_CASES = [(coll, algo, ("float32", "bfloat16")[i % 2], "sum", 2500 + 7, 0, False)
              for i, (coll, algo) in enumerate(ONE_SIDED)]


def grids(comm, sms_counts):
    """Per emulated SM count (COMMLIB_EMULATED_SMS, a sub-communicator each): (the engine's
    one-sided grid, failures, digests, counters of GRID_CASES, mapped then staged in the arena)."""
    import commlib.emulated as emu

    def run(sub):
        fails, digests = [], []
        emu.synchronize()
        emu.kernel_counters(reset=True)
        for shareable in (True, False):
            device_cases.SHAREABLE = shareable
            try:
                f, d = device_cases.check_cases(sub, GRID_CASES)
            finally:
                device_cases.SHAREABLE = True
            fails += f
            digests += d  # mapped and staged alike: the same fold in rank order
        emu.synchronize()
        return sub._device_route._last_engine.kernel_one_sided_grid(), fails, digests, emu.kernel_counters()
    return [with_settings(comm, dict(SETTINGS, COMMLIB_EMULATED_SMS=str(n)), run) for n in sms_counts]


class _Raw:
    """Device memory an emulated Array views without owning it (the test frees it itself)."""

    def __init__(self, ptr):
        self.ptr = ptr


def freed_and_reallocated(comm):
    """mapped_two_shot on every rank's registered buffer, then rank 1's buffer freed and another
    allocated at the same address with other contents, then the call again, several times: the
    results of every call, and how many calls staged (kernel counters). A peer reading rank 1's
    old allocation through a stale mapping would sum its old bytes."""
    import numpy as np

    import commlib.emulated as emu

    def run(sub):
        dev, s = emu.device(), emu.current_stream()
        n = 1024

        def array(value, at=0):
            ptr = dev.allocate_with(n * 4, at, True)
            dev.upload(ptr, np.full(n, value, np.float32).tobytes(), s._stream)
            return ptr, emu.Array(_Raw(ptr), emu.current_device(), 0, n, "float32")

        ptr, x = array(sub.rank + 1)
        results = []
        emu.kernel_counters(reset=True)
        for i in range(3):
            sub.all_reduce(x, algorithm="mapped_two_shot")
            results.append(float(x.numpy()[0]))
            sub.barrier()  # every rank's call done before rank 1 frees the buffer its peers mapped
            if sub.rank == 1:
                dev.free_ordered(ptr, s._stream)
                s.synchronize()
                ptr, x = array(10 * (i + 1), at=ptr)  # the same address, a new allocation
                assert x.data_ptr() == ptr
            else:
                dev.upload(ptr, np.full(n, sub.rank + 1, np.float32).tobytes(), s._stream)
        s.synchronize()
        staged = emu.kernel_counters()["staged_bytes"]
        sub.barrier()
        dev.free_ordered(ptr, s._stream)
        s.synchronize()
        return results, staged
    return with_settings(comm, SETTINGS, run)


def one_sided_matrix_cuda(comm, cases):
    """(failures, digests, paths, grids) for `cases`, [(route, case)], with torch CUDA tensors on a
    kernel-path sub-communicator per staging setting (test_one_sided_cuda.py, on a GPU): the same
    settings as the emulated matrix. Whether the tensors are mapped or staged is the allocator's
    (the pool's PYTORCH_CUDA_ALLOC_CONF): the routes "arena" and "slots" only choose the staging.
    grids: per sub-communicator (its one-sided grid, the device's SM count, this rank's budget)."""
    import torch

    import device_cuda_cases

    def run(sub, route):
        fails, digests, paths = [], [], set()
        for c in [c for r, c in cases if r == route]:
            f, d = device_cuda_cases.check_cases(sub, [c])
            fails += f
            digests += d
            paths.add(sub._device_route.last_path())
        torch.cuda.synchronize()
        engine = sub._device_route._last_engine
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return fails, digests, paths, (engine.kernel_one_sided_grid(), sms, engine.kernel_grid_budget())
    out = [[], [], set(), []]
    for route in sorted({r for r, _ in cases}):
        settings = dict(SETTINGS, COMMLIB_DEVICE_STAGING="slots") if route == "slots" else SETTINGS
        f, d, p, g = with_settings(comm, settings, run, route)
        out[0] += f
        out[1] += d
        out[2] |= p
        out[3].append(g)
    return out[0], out[1], sorted(out[2]), out[3]


def two_byte_fused(comm, count):
    """The fused kernels' packed accumulators (plan_reduce_to_all.cuh, gpu::WordFold): float16 and
    bfloat16 (both packed), every float op but the scaled ones, mapped_fused_two_shot all_reduce and mapped_fused
    reduce_scatter on `count` elements per block (the tail predicated, an odd count element by
    element): [(what, whether the result is bit for bit the CPU kernel's fold in rank order 0..P-1)]."""
    import numpy as np

    from commlib import _C
    import commlib.emulated as emu
    from commlib.core.call_spec import DTYPE, OP

    def inputs(P, n, dtype):
        out = []
        for q in range(P):
            x = np.random.default_rng(1000 + q).uniform(0.5, 2.0, n).astype(np.float32)
            out.append(x.astype(np.float16).view(np.uint16) if dtype == "float16"
                       else (x.view(np.uint32) >> 16).astype(np.uint16))  # bfloat16 bits (truncated)
        return out

    def run(sub):
        P, r = sub.size, sub.rank
        results = []
        for dtype in ("float16", "bfloat16"):
            for op in ("sum", "prod", "min", "max"):
                for coll, algo, n_in in (("all_reduce", "mapped_fused_two_shot", count),
                                         ("reduce_scatter", "mapped_fused", count * P)):
                    xs = inputs(P, n_in, dtype)
                    want = xs[0].copy()
                    for q in range(1, P):
                        _C.reduce_local(want, xs[q], DTYPE[dtype], OP[op])
                    if coll == "reduce_scatter":
                        want = want[r * count:(r + 1) * count]
                    x = emu.from_numpy(xs[r].view(np.float16), shareable=True) if dtype == "float16" \
                        else emu.from_numpy(xs[r], dtype="bfloat16", shareable=True)
                    y = emu.empty(len(want), dtype, shareable=True)
                    if coll == "all_reduce":
                        sub.all_reduce(x, out=y, op=op, algorithm=algo)
                    else:
                        sub.reduce_scatter(y, x, op=op, algorithm=algo)
                    got = np.asarray(y.numpy()).view(np.uint16)
                    results.append(((coll, dtype, op), bool(np.array_equal(got, want))))
        return results
    return with_settings(comm, SETTINGS, run)


def arena_fallback(comm, failing):
    """Rank `failing` cannot allocate a staging arena (the test hook: as out of memory): the first
    staged call's growth finds some rank without one, so every rank turns pool staging off and
    runs the slots path from then on, never waiting on a growth again. With 4 KiB slots (16 KiB in
    all at 2 ranks) a staged all_reduce of 1000 floats fits them; one of 8192 does not, and is
    refused by name on every rank (a ValueError, not a hang). Per rank: (results of the calls that
    fit, each rank's arena bytes and arenas grown, the refusal, the result after it)."""
    import numpy as np

    import commlib.emulated as emu

    def staged(sub, n):
        x = emu.from_numpy(np.full(n, sub.rank + 1, np.float32), shareable=False)
        sub.all_reduce(x, algorithm="mapped_fused_two_shot")
        return bool(np.all(x.numpy() == sub.size * (sub.size + 1) / 2))

    def run(sub):
        y = emu.from_numpy(np.ones(8, np.float32))
        sub.all_reduce(y, algorithm="ring")  # the engine, no arena
        engine = sub._device_route._last_engine
        if sub.rank == failing:
            engine.kernel_fail_arena_allocations(True)
        fits = [staged(sub, n) for n in (1000, 13, 1000)]
        arena = (engine.kernel_staging_arena(), engine.kernel_arena_counts()["grown"])
        try:
            refused = f"no error: {staged(sub, 8192)}"
        except Exception as e:  # noqa: BLE001 - the message is the result
            refused = f"{type(e).__name__}: {e}"
        return fits, arena, refused, staged(sub, 1000)
    return with_settings(comm, dict(SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="4096", COMMLIB_TIMEOUT="20"), run)


def mixed_in_place_all_to_all(comm, in_place_ranks):
    """An all_to_all (the one-sided "mapped" algorithm, and auto) in place on `in_place_ranks` and
    out of place on the others (a per-rank choice, as for every other algorithm: the call's
    descriptor does not carry it): it used to leave the in-place ranks out of the route's
    agreement and the others waiting there for the timeout; now every rank agrees (the in-place
    ranks register no input), so every rank stages, promptly. Then all in place. Per rank: ((the
    result right, seconds) per algorithm, the all-in-place result right)."""
    import time

    import numpy as np

    import commlib.emulated as emu

    def run(sub):
        n = 6 * sub.size
        want = np.concatenate([np.arange(6, dtype=np.float32) + 6 * sub.rank + 100 * q for q in range(sub.size)])
        out = []
        for algorithm in ("mapped", "auto", "mapped"):
            x = emu.from_numpy(np.arange(n, dtype=np.float32) + 100 * sub.rank)
            y = x if sub.rank in in_place_ranks else emu.empty(n, "float32")
            t = time.monotonic()
            try:
                sub.all_to_all(y, x, algorithm=algorithm)
                got = bool(np.array_equal(y.numpy(), want))
            except Exception as e:  # noqa: BLE001 - the message is the result
                got = f"{type(e).__name__}: {e}"
            out.append((got, time.monotonic() - t))
        x = emu.from_numpy(np.arange(n, dtype=np.float32) + 100 * sub.rank)
        sub.all_to_all(x, x, algorithm="mapped")
        return out, bool(np.array_equal(x.numpy(), want))
    return with_settings(comm, dict(SETTINGS, COMMLIB_TIMEOUT="30"), run)
