"""Rank side of test_one_sided_state.py: what the one-sided calls keep across calls (the agreement's
views and route, stream/one_sided_scratch.h; the mapped table's key, KernelPath::mapped_words_) and
what they take from a peer's ring entry (PeerBuffers::agree). Apart from the test module so that
the ranks import no pytest."""
import os
import time

import numpy as np

import commlib
import commlib.emulated as emu
from kernel_path_cases import KERNEL_SETTINGS, with_settings

ALGO = "mapped_fused_two_shot"  # device auto's pick at 16 KiB-1 MiB on mapped buffers (device_auto.h)


def _arr(values, dtype="float32"):
    return emu.from_numpy(np.asarray(values, dtype))


def changing_buffers(comm):
    """Mapped all_reduces on one communicator whose buffers change between calls in every way the
    kept route could go stale: another buffer, another size, another dtype, out of place then in
    place, only rank 1's buffer new, after a call refused for a bad argument. Per step: (what,
    whether the output is the sum of the call's inputs, whether the buffers the call does not name
    kept their bytes, the algorithm run, bytes staged by the launch (0: mapped))."""
    def run(sub):
        P, r = sub.size, sub.rank
        want = P * (P + 1) // 2  # inputs r + 1
        steps = []
        keep = []  # (array, its bytes) that no later call may write

        def step(what, x, out=None, dtype="float32"):
            emu.synchronize()
            emu.kernel_counters(reset=True)
            sub.all_reduce(x, out=out, algorithm=ALGO)
            y = (out if out is not None else x).numpy()
            c = emu.kernel_counters()
            kept = all(np.array_equal(a.numpy(), b) for a, b in keep)
            steps.append((what, bool(np.all(y == want)), kept, sub._device()._last_engine.last_algorithm(),
                          c["staged_bytes"]))

        n = 4096 + 7
        a = _arr(np.full(n, r + 1))
        step("first", a)
        a2 = _arr(np.full(n, r + 1))
        step("steady", a2)  # (another buffer of the same shape: the table's key changes)
        keep.append((a2, a2.numpy().copy()))
        b = _arr(np.full(3 * n, r + 1))
        step("larger buffer", b)
        keep.append((b, b.numpy().copy()))
        c = _arr(np.full(n // 3, r + 1))
        step("smaller buffer", c)
        keep.append((c, c.numpy().copy()))
        d = _arr(np.full(n, r + 1), "int32")
        step("int32", d)
        keep.append((d, d.numpy().copy()))
        e_in, e_out = _arr(np.full(n, r + 1)), _arr(np.full(n, -1.0))
        keep.append((e_in, e_in.numpy().copy()))
        step("out of place", e_in, e_out)
        keep.append((e_out, e_out.numpy().copy()))
        f = _arr(np.full(n, r + 1))
        step("in place again", f)
        keep.append((f, f.numpy().copy()))
        g = _arr(np.full(n, r + 1)) if r == 1 else None
        # only rank 1 has a new buffer; the others call again on f (refilled)
        if r != 1:
            keep.pop()
            f.copy_(_arr(np.full(n, r + 1)))
            g = f
        step("rank 1 alone new", g)
        keep.append((g, g.numpy().copy()))
        try:  # refused on every rank before any agreement: out's dtype differs
            sub.all_reduce(_arr(np.full(n, r + 1)), out=_arr(np.zeros(n), "int32"), algorithm=ALGO)
            refused = "no error"
        except (ValueError, TypeError, commlib.CommError) as err:
            refused = type(err).__name__
        h = _arr(np.full(n, r + 1))
        step("after a refused call", h)
        keep.append((h, h.numpy().copy()))
        i = _arr(np.full(n, r + 1))
        step("after a refused call, again", i)
        return steps, refused
    return with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="65536"), run)


def _table_layout():
    """The layout of a rank's table of peers' buffers, as the library builds it
    (_C._peer_buffers_table_layout: csrc/device/peer_buffers_table.h): (segments' offset, segment
    bytes, segment count, agreed ring's offset, ring calls, buffers a call, entry bytes). The struct
    formats below read a segment as {seq, id, bytes, handle} and an entry as {seq, call_plus_one,
    id, offset, slot, bytes}, 8-byte words in that order: checked here, so a change to the table
    fails the forging tests by name instead of forging the wrong field."""
    from commlib import _C
    t = _C._peer_buffers_table_layout()
    assert (t["segment_id"], t["segment_bytes_field"], t["segment_handle"]) == (8, 16, 24), t
    assert (t["entry_call_plus_one"], t["entry_id"], t["entry_offset"], t["entry_slot"],
            t["entry_bytes_field"]) == (8, 16, 24, 32, 40), t
    return (t["segments"], t["segment_bytes"], t["segment_count"], t["agreed"], t["ring_calls"],
            t["buffers_per_call"], t["entry_bytes"])


def _peer_buffer_tables():
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "commlib-peer-buffers" in os.readlink(f"/proc/self/fd/{fd}"):
                out.add(int(fd))
        except OSError:
            pass
    return out


def _inflated_segment(m, slot):
    """Registers, in a free slot of this rank's own table `m`, a copy of segment `slot` (the same
    memory handle) under a new buffer id, claiming 64 times its bytes: (new id, new slot, the
    allocation's real bytes)."""
    import struct
    first, seg_bytes, segments = _table_layout()[:3]
    at = lambda k: first + k * seg_bytes  # noqa: E731
    seq, bid, nbytes = struct.unpack_from("<QQQ", m, at(slot))
    handle = bytes(m[at(slot) + 24:at(slot) + seg_bytes])
    free = next(k for k in range(segments - 1, -1, -1) if struct.unpack_from("<Q", m, at(k) + 8)[0] == 0)
    s = struct.unpack_from("<Q", m, at(free))[0]
    struct.pack_into("<Q", m, at(free), s + 1)
    struct.pack_into("<QQ", m, at(free) + 8, bid + (1 << 48), nbytes * 64)
    m[at(free) + 24:at(free) + seg_bytes] = handle
    struct.pack_into("<Q", m, at(free), s + 2)
    return bid + (1 << 48), free, nbytes


def forged_entry(comm, victim, field, value):
    """Rank `victim` overwrites its own agree ring's entries of the next one-sided call (what a peer
    says: `field` "offset" or "slot" set to `value`, or "call": the entry's call number `value` calls
    on, its buffer's id kept, or "segment": a new segment of the same memory claiming 64 times its
    bytes, the entries `value` bytes past the real allocation's end) and never makes the call;
    the others make it. A survivor returns (the error's type and message, seconds); the victim None."""
    import contextlib
    import mmap
    import struct

    from commlib.testing.faults import mark_reached, wait_until_reached

    def run(sub):
        before = _peer_buffer_tables()
        r = sub.rank
        x = _arr(np.full(4096, r + 1))
        sub.all_reduce(x, algorithm=ALGO)  # the engine made, every rank's buffer registered, mapped
        x.numpy()
        sub.barrier()
        if r == victim:
            (fd,) = _peer_buffer_tables() - before
            agreed, ring, per_call, entry = _table_layout()[3:]
            with open(f"/proc/self/fd/{fd}", "r+b") as f:
                m = mmap.mmap(f.fileno(), 0)
                entries = [struct.unpack_from("<QQQQQQ", m, agreed + k * entry) for k in range(ring * per_call)]
                last = max(e[1] for e in entries) - 1  # the last call this rank agreed on
                nxt = last + 1
                if field == "segment":
                    forged = _inflated_segment(m, entries[(last % ring) * per_call][4])
                for w in (0, 1):
                    seq, _, bid, offset, slot, nbytes = entries[(last % ring) * per_call + w]
                    fields = dict(offset=offset, slot=slot, call=nxt)
                    if field == "segment":  # past the real allocation, inside the claimed one
                        bid, fields["slot"], fields["offset"] = forged[0], forged[1], forged[2] + value
                    else:
                        fields[field] = value if field != "call" else nxt + value
                    at = agreed + ((nxt % ring) * per_call + w) * entry
                    s = struct.unpack_from("<Q", m, at)[0]
                    struct.pack_into("<Q", m, at, s + 1)
                    struct.pack_into("<QQQQQ", m, at + 8, fields["call"] + 1, bid, fields["offset"], fields["slot"],
                                     nbytes)
                    struct.pack_into("<Q", m, at, s + 2)
                m.close()
            sub.barrier()
            with contextlib.suppress(TimeoutError):  # the others fail meanwhile; the pool is killed after
                wait_until_reached(sub, "refused", [q for q in range(sub.size) if q != victim], limit_s=30)
            return None
        sub.barrier()
        t = time.monotonic()
        y = _arr(np.full(4096, r + 1))
        try:
            sub.all_reduce(y, algorithm=ALGO)
            y.numpy()
            err = sub.async_error()
            out = ("no error" if err is None else f"{type(err).__name__}: {err}"), time.monotonic() - t
        except Exception as e:  # noqa: BLE001 - the message is the result
            out = f"{type(e).__name__}: {e}", time.monotonic() - t
        mark_reached(sub, "refused")
        return out
    from commlib.settings import overridden
    with overridden(dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="65536")):
        sub = comm.split(0, timeout=30)
        return run(sub)


def _mapped_call_raising(sub):
    """One mapped all_reduce on `sub`, waited for, raising the engine's error if it failed."""
    y = _arr(np.full(4096, sub.rank + 1))
    sub.all_reduce(y, algorithm=ALGO)
    y.numpy()
    err = sub.async_error()
    if err is not None:
        raise err


def killed_in_agreement(comm, victim):
    """`victim` never makes a mapped call its peers make (it is SIGKILLed meanwhile): the survivors
    wait in the route's agreement (PeerBuffers::agree) and must raise a PeerError naming it and the
    collective: (message, seconds) per survivor, None on the victim."""
    from commlib.settings import overridden
    from commlib.testing.faults import arm_death, survivor_outcome

    with overridden(dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="65536")):
        sub = comm.split(0, timeout=30)
        x = _arr(np.full(4096, sub.rank + 1))
        sub.all_reduce(x, algorithm=ALGO)
        x.numpy()
        sub.barrier()
        if arm_death(sub, victim, kill_in_s=0.5, late_s=0.0):
            time.sleep(20)
            return None
        return survivor_outcome(lambda: _mapped_call_raising(sub))


def closed_in_agreement(comm, leaver):
    """`leaver` closes its communicator instead of making a mapped call its peers make: the others
    wait in the route's agreement for an entry a closing rank will never write, and must raise a
    PeerError naming it and the collective well within the timeout (session 35: they waited it
    out, the leaver's close waiting out the same timeout in its closing barrier for them).
    (message, seconds) per survivor, the leaver's close's seconds on the leaver."""
    from commlib.settings import overridden
    from commlib.testing.faults import survivor_outcome

    with overridden(dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="65536")):
        sub = comm.split(0, timeout=30)
        x = _arr(np.full(4096, sub.rank + 1))
        sub.all_reduce(x, algorithm=ALGO)  # every rank's entry of a first agreed call: the rings work
        x.numpy()
        sub.barrier()
        if sub.rank == leaver:
            t = time.monotonic()
            sub.close()
            return time.monotonic() - t
        out = survivor_outcome(lambda: _mapped_call_raising(sub))
        sub.close()
        return out
