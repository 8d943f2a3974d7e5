"""Rank side of test_peer_buffers.py (apart from the test module so that the ranks import neither
pytest nor the test modules): the kernel path's registry of peers' buffers (device/peer_buffers.h)
looked up through the engine, each rank's buffer read back through the peers' mappings. The
engine's settings helpers are the kernel path's tests' (tests/stream/kernel_path_cases.py)."""
import os
import sys

import numpy as np

import commlib.emulated as emu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stream"))
from kernel_path_cases import KERNEL_SETTINGS, with_settings  # noqa: E402

NBYTES = 3 * 4096 + 100  # a few pages: offsets inside the allocation
OFFSET = 4096 + 64


def _engine(sub):
    x = emu.from_numpy(np.ones(4, np.float32))
    sub.all_reduce(x)  # sets the engine up (the handles, the peers' tables)
    x.numpy()
    return next(iter(sub._device()._engines.values()))


def _fill(dev, ptr, value, nbytes=NBYTES):
    s = emu.current_stream()
    dev.upload(ptr, bytes([value % 256]) * nbytes, s._stream)
    s.synchronize()


def _tags(sub, own):
    """Every rank's own (buffer id, offset), gathered over the host."""
    mine = np.array(own, np.int64)
    out = np.zeros(2 * sub.size, np.int64)
    sub.all_gather(out, mine)
    return [tuple(int(v) for v in out[2 * r:2 * r + 2]) for r in range(sub.size)]


def _seen(dev, view, sub, nbytes):
    """What this rank reads at every peer's mapped address: one byte value per peer (None: not
    mapped; -1: not one value)."""
    out = []
    for p, addr in enumerate(view["peers"]):
        if p == sub.rank or not addr:
            out.append(None)
            continue
        data = set(dev.read(addr, nbytes))
        out.append(data.pop() if len(data) == 1 else -1)
    return out


def mapped_and_freed(comm):
    """A buffer looked up twice (a miss, then a hit), then freed and allocated again at the same
    address with other bytes (a new buffer id): what each rank reads through its peers' mappings
    each time, and the registry's counts."""
    def run(sub):
        engine, dev = _engine(sub), emu.device()
        base = dev.allocate_with(NBYTES + OFFSET, 0, True)
        _fill(dev, base + OFFSET, 10 + sub.rank)
        want = [None if p == sub.rank else 10 + p for p in range(sub.size)]
        first = engine.peer_buffer_lookup(1, 0, base + OFFSET, NBYTES)
        seen = [_seen(dev, first, sub, NBYTES) == want]
        again = engine.peer_buffer_lookup(2, 0, base + OFFSET, NBYTES)
        seen.append(_seen(dev, again, sub, NBYTES) == want and again["own"] == first["own"])
        stats = engine.peer_buffer_stats()
        hits = (stats["misses"], stats["hits"], stats["registered"])
        sub.barrier()  # every rank read the old bytes before any frees them
        s = emu.current_stream()
        dev.free_ordered(base, s._stream)
        s.synchronize()
        again_base = dev.allocate_with(NBYTES + OFFSET, base, True)  # the same address, a new buffer
        _fill(dev, again_base + OFFSET, 50 + sub.rank)
        fresh = engine.peer_buffer_lookup(3, 0, again_base + OFFSET, NBYTES)
        seen.append(_seen(dev, fresh, sub, NBYTES) == [None if p == sub.rank else 50 + p for p in range(sub.size)])
        seen.append(fresh["own"] != first["own"] and fresh["own"][1] == OFFSET)
        stats = engine.peer_buffer_stats()
        sub.barrier()
        counts = engine.peer_buffer_counts()
        sub.barrier()
        dev.free_ordered(again_base, s._stream)
        return seen, hits, (stats["retired"], stats["registered"]), counts
    return with_settings(comm, KERNEL_SETTINGS, run)


def unshareable_is_staged(comm):
    """Rank 1's buffer has no shareable handle (a VMM or pool allocation): (own tag registered?,
    peers mapped) per rank: nobody maps rank 1's, rank 1 maps nobody."""
    def run(sub):
        engine, dev = _engine(sub), emu.device()
        ptr = dev.allocate_with(4096, 0, sub.rank != 1)
        view = engine.peer_buffer_lookup(7, 1, ptr, 4096)
        stats = engine.peer_buffer_stats()
        sub.barrier()
        s = emu.current_stream()
        dev.free_ordered(ptr, s._stream)
        s.synchronize()
        return view["own"][0] != 0, [bool(a) for a in view["peers"]], stats["unshareable"]
    return with_settings(comm, KERNEL_SETTINGS, run)


def mispredicted_is_flagged(comm):
    """Rank 0 keeps its buffer while rank 1 moves to another: rank 0 looks up before rank 1 reached
    the call (a host barrier after), so it predicts rank 1's old buffer. The answer must say which
    buffer its address assumes (`expect`), and that must differ from rank 1's own tag, so a kernel
    never uses it; the next such lookup has learnt rank 1's new buffer. Returns per step whether
    rank 0's expectation of rank 1 matched rank 1's own tag, and what rank 0 read there."""
    def run(sub):
        engine, dev = _engine(sub), emu.device()
        a = dev.allocate_with(4096, 0, True)
        _fill(dev, a, 20 + sub.rank, 4096)
        engine.peer_buffer_lookup(10, 0, a, 4096)  # both learn each other's buffer
        b = dev.allocate_with(4096, 0, True) if sub.rank == 1 else a
        _fill(dev, b, 30 + sub.rank, 4096)
        out = []
        for call in (11, 12):
            if sub.rank == 0:
                view = engine.peer_buffer_lookup(call, 0, b, 4096)
                sub.barrier()
            else:
                sub.barrier()
                view = engine.peer_buffer_lookup(call, 0, b, 4096)
            tags = _tags(sub, view["own"])
            if sub.rank == 0:
                match = tuple(view["expect"][1]) == tags[1]
                out.append((match, _seen(dev, view, sub, 4096)[1] if match else None))
        sub.barrier()
        s = emu.current_stream()
        for p in {a, b}:
            dev.free_ordered(p, s._stream)
        s.synchronize()
        return out, engine.peer_buffer_stats()["mispredicted"]
    return with_settings(comm, KERNEL_SETTINGS, run)


def closed_with_the_communicator(comm):
    """Registrations and imports after the communicator closed: (before, after)."""
    dev = emu.device()
    with_settings_result = {}

    def run(sub):
        engine = _engine(sub)
        ptr = dev.allocate_with(4096, 0, True)
        engine.peer_buffer_lookup(20, 0, ptr, 4096)
        sub.barrier()  # the peer mapped this rank's buffer before it is freed
        with_settings_result["engine"] = engine
        with_settings_result["ptr"] = ptr
        return engine.peer_buffer_counts()
    before = with_settings(comm, KERNEL_SETTINGS, run)
    after = with_settings_result["engine"].peer_buffer_counts()
    s = emu.current_stream()
    dev.free_ordered(with_settings_result["ptr"], s._stream)
    s.synchronize()
    return tuple(before), tuple(after)


def symmetric_pool(comm):
    """commlib.device.empty from the communicator's symmetric pool: blocks at the same offset on
    every rank, usable by collectives, mapped when the arena is made through ONE registration (the
    arena), so the first lookup of a block is a hit that waits for nobody; a block released on one
    rank only is not reused anywhere; released everywhere, it is; an arena whose blocks all
    returned is unmapped, then freed with no peer mapping it; the communicator's close frees the
    rest. Returns the checks' outcomes in order."""
    import gc

    import commlib.device as cdev
    from commlib.device.symmetric import ARENA_BYTES, pool_of
    kept = {}

    def run(sub):
        engine, dev = _engine(sub), emu.device()
        pool = kept["pool"] = pool_of(sub, "emulated")
        a = cdev.empty(1000, "float32", comm=sub, device="emulated")
        b = cdev.empty((4, 8), "int32", comm=sub, device="emulated")
        checks = []
        offsets = [pool.offset_of(a), pool.offset_of(b)]
        checks.append(_tags(sub, offsets[0]) == [offsets[0]] * sub.size)
        a.copy_(emu.from_numpy(np.full(1000, sub.rank + 1, np.float32)))
        sub.all_reduce(a)
        checks.append(bool((a.numpy() == 3).all()))
        sub.barrier()  # every rank's stream finished its all_reduce before a peer reads its block
        checks.append(engine.symmetric_arenas() == 1)  # mapped when made, before any call used it
        before = engine.peer_buffer_stats()
        view = engine.peer_buffer_lookup(30, 0, a.data_ptr(), a.nbytes)
        after = engine.peer_buffer_stats()
        peer = 1 - sub.rank
        got = np.frombuffer(dev.read(view["peers"][peer], a.nbytes), np.float32)
        checks.append(bool((got == 3).all()))
        # a block's first lookup: a hit inside the arena, no miss, no wait for the peer
        checks.append(tuple(after[k] - before[k] for k in ("arena_hits", "misses", "waits")) == (1, 0, 0))
        emu.kernel_counters(reset=True)
        sub.all_reduce(a, algorithm="mapped_two_shot")  # one-sided, agreed: mapped in place, nothing staged
        checks.append(bool((a.numpy() == 6).all()) and emu.kernel_counters()["staged_bytes"] == 0)
        engine.peer_buffer_lookup(31, 1, b.data_ptr(), b.nbytes)
        checks.append(engine.peer_buffer_stats()["registered"] == 1)  # one arena, one registration
        sub.barrier()
        # (x passes through no collective: the device call cache keeps a call's buffers alive)
        x = cdev.empty(1000, "float32", comm=sub, device="emulated")
        x_at = pool.offset_of(x)
        if sub.rank == 0:
            del x
            gc.collect()
        c = cdev.empty(1000, "float32", comm=sub, device="emulated")
        c_at = pool.offset_of(c)
        checks.append(_tags(sub, c_at) == [c_at] * sub.size and c_at != x_at)
        if sub.rank == 1:
            del x
            gc.collect()
        d = cdev.empty(1000, "float32", comm=sub, device="emulated")
        checks.append(pool.offset_of(d) == x_at)
        # an arena of its own, released everywhere: unmapped at the next empty, freed at the one after
        mapped_frees = emu.rule_counts()["exports_freed_while_mapped"]
        big = cdev.empty(ARENA_BYTES // 4 + 1, "float32", comm=sub, device="emulated")
        seen = [(pool.arenas(), engine.symmetric_arenas(), engine.peer_buffer_counts())]
        del big
        gc.collect()
        for _ in range(2):
            kept.setdefault("small", []).append(cdev.empty(8, "float32", comm=sub, device="emulated"))
            seen.append((pool.arenas(), engine.symmetric_arenas(), engine.peer_buffer_counts()))
        checks.append(seen == [(2, 2, (2, 2)), (2, 1, (1, 1)), (1, 1, (1, 1))])
        emu.synchronize()  # the frees are stream-ordered
        sub.barrier()
        checks.append(emu.rule_counts()["exports_freed_while_mapped"] == mapped_frees)
        kept.pop("small")
        return checks
    checks = with_settings(comm, KERNEL_SETTINGS, run)
    gc.collect()
    return checks + [kept["pool"].arenas() == 0]  # the close freed every arena nobody holds


def lookups_mixed_with_agreed_calls(comm):
    """The tests' lookups (their own call numbers 1, 2, ...) and the engine's one-sided calls
    (agree: the engine's numbers 1, 2, ...) on one registry. Every rank looks up a buffer of bytes
    99 as call 1 (and as call 2 for which 1), then, after a host barrier, runs mapped_two_shot
    all_reduces (agreed calls 1 and 2) on other buffers every rank maps, rank 1 late (so rank 0
    agrees before rank 1 wrote its entry: in a shared ring it read rank 1's lookup entry of call 1
    as rank 1's input, and summed its 99s); then looks up again as call 2. Returns (the reduced
    results right, the later lookup reads every peer's buffer)."""
    import time

    def run(sub):
        engine, dev = _engine(sub), emu.device()
        base = dev.allocate_with(4096, 0, True)
        _fill(dev, base, 99, 4096)
        engine.peer_buffer_lookup(1, 0, base, 4096)
        engine.peer_buffer_lookup(2, 1, base, 4096)
        sub.barrier()
        right = []
        for k in range(2):
            if sub.rank == 1:
                time.sleep(0.5)
            x = emu.from_numpy(np.full(1000, sub.rank + 1 + k, np.float32))
            sub.all_reduce(x, algorithm="mapped_two_shot")
            right.append(bool((x.numpy() == sum(q + 1 + k for q in range(sub.size))).all()))
        view = engine.peer_buffer_lookup(2, 0, base, 4096)
        seen = _seen(dev, view, sub, 4096) == [None if p == sub.rank else 99 for p in range(sub.size)]
        sub.barrier()
        s = emu.current_stream()
        dev.free_ordered(base, s._stream)
        s.synchronize()
        return right, seen
    return with_settings(comm, KERNEL_SETTINGS, run)
