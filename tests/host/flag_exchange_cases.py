"""Rank-side cases of the flag exchanges (auto's small all_gather, all_to_all, all_reduce and
reduce_scatter on one host through the shared-memory flags, csrc/host/flag_calls.cc): every dtype,
op, placement and count up to the largest the slot takes (and one more, which goes back to the
schedule), whether the call took the flags (it sends no channel message), ranks that disagree on
the count, a rank that dies before it writes, and slot rings wrapped by ranks running ahead."""
from __future__ import annotations

import hashlib
import os
import signal
import threading

import numpy as np

import commlib
from collective_cases import Failures, HostBuffers, run_moving, run_reducing
from collective_reference import DTYPES, ITEM_BYTES, ops_for, raw, report
from commlib.testing.faults import survivor_outcome

SLOT_BYTES = 8192  # csrc/transport/shm/shm_layout.h kFlagSlotBytes
EXCHANGES = ("all_gather", "all_to_all", "all_reduce", "reduce_scatter")


def largest_fitting(collective, dtype, P):
    """The largest count whose input (one block, or P for all_to_all and reduce_scatter) fits a slot."""
    per = ITEM_BYTES[dtype] * (P if collective in ("all_to_all", "reduce_scatter") else 1)
    return SLOT_BYTES // per


def exchange_matrix(comm):
    """Every exchange x dtype x op x placement at counts 0, 1, P - 1, 13, the largest that fits and
    one more, through auto: checked against NumPy (collective_reference's tolerances), all_reduce's
    result digested (it must be the same bits on every rank), and the path checked: a call that fits
    sends no channel message, one that does not fit does. The machine's tuned cutoffs (the tuning
    file's "flags" section) are lifted meanwhile, so every size a slot takes is covered."""
    import commlib._C as _C
    _C.set_flag_cutoffs({})
    try:
        return _exchange_matrix(comm)
    finally:
        from commlib.core import tuning
        tuning.load_default()


def _exchange_matrix(comm):
    from commlib.core.call_spec import COLLECTIVE
    P, r = comm.size, comm.rank
    failures, digests = Failures(), []
    for collective in EXCHANGES:
        reducing = collective in ("all_reduce", "reduce_scatter")
        for dtype in DTYPES:
            fit = largest_fitting(collective, dtype, P)
            for count in sorted({0, 1, max(P - 1, 0), 13, fit, fit + 1}):
                flags = count <= fit and P > 1
                said = comm._core.auto_runs_flag_call(COLLECTIVE[collective], count * ITEM_BYTES[dtype])
                if said != flags:
                    failures.append(f"{collective} {dtype} count={count} P={P}: auto_runs_flag_call says {said}")
                for op in (ops_for(dtype, count) if reducing else (None,)):
                    for inplace in (False, True):
                        what = (f"{collective} {dtype} {op or ''} count={count} "
                                f"{'in-place' if inplace else 'out-of-place'} P={P} rank={r}")
                        sent = comm._core.bytes_sent()
                        try:
                            if reducing:
                                out, want, mag = run_reducing(comm, HostBuffers, collective, "auto", dtype, op, count,
                                                              0, inplace)
                            else:
                                (out, want), mag = run_moving(comm, HostBuffers, collective, "auto", dtype, count, 0,
                                                              inplace), None
                        except Exception as e:  # noqa: BLE001 - report every case
                            failures.append(f"{what}: raised {type(e).__name__}: {e}")
                            continue
                        moved = comm._core.bytes_sent() - sent
                        if flags and moved:
                            failures.append(f"{what}: fits the flags but sent {moved} bytes through the channels")
                        if not flags and count and P > 1 and not moved:
                            failures.append(f"{what}: too large for the flags yet sent nothing through the channels")
                        if report(failures, what, dtype, out, want, mag, P) and collective == "all_reduce":
                            digests.append((what.rsplit(" rank=", 1)[0], hashlib.sha1(raw(out)).hexdigest()))
    return failures.listed(), digests


def tuned_cutoffs(comm):
    """With cutoffs installed (the tuning file's "flags" section: all_reduce up to 1 KiB, all_gather
    never), auto takes the flags exactly up to them: float32 all_reduce of 256 elements through the
    flags (no channel message), of 257 through the schedule, all_gather of 1 through the schedule;
    auto_runs_flag_call says the same, and every result is right. Returns the failures."""
    import commlib._C as _C
    from commlib.core.call_spec import COLLECTIVE
    P, r = comm.size, comm.rank
    failures = []
    _C.set_flag_cutoffs({COLLECTIVE["all_reduce"]: {P: 1024}, COLLECTIVE["all_gather"]: {P: -1}})
    try:
        for collective, count, flags in (("all_reduce", 256, True), ("all_reduce", 257, False),
                                         ("all_reduce", 1, True), ("all_gather", 1, False)):
            flags = flags and P > 1
            said = comm._core.auto_runs_flag_call(COLLECTIVE[collective], count * 4)
            if said != flags:
                failures.append(f"{collective} count={count} P={P}: auto_runs_flag_call says {said}")
            sent = comm._core.bytes_sent()
            x = np.arange(count, dtype=np.float32) + r
            if collective == "all_reduce":
                comm.all_reduce(x)
                ok = np.array_equal(x, sum(np.arange(count, dtype=np.float32) + q for q in range(P)))
            else:
                out = np.zeros(count * P, np.float32)
                comm.all_gather(out, x)
                ok = np.array_equal(out, np.concatenate([np.arange(count, dtype=np.float32) + q for q in range(P)]))
            moved = comm._core.bytes_sent() - sent
            if not ok:
                failures.append(f"{collective} count={count} P={P} rank={r}: wrong result")
            if P > 1 and bool(moved) == flags:
                failures.append(f"{collective} count={count} P={P} rank={r}: flags={flags} but sent {moved} bytes")
    finally:
        from commlib.core import tuning
        tuning.load_default()
    return failures


def disagreeing_counts(comm, collective):
    """Rank 1 passes another count than the others, every count fitting the flags: all_reduce 3
    elements against 2, or all_gather 0 against 2 (a rank with nothing to take still reads every
    slot's description). Every rank reads every slot, so every rank raises MismatchError naming
    the call, and nobody hangs. Returns "Type: message", or None when the call returned."""
    n = (3 if collective == "all_reduce" else 0) if comm.rank == 1 else 2
    x = np.ones(n, np.float32)
    try:
        if collective == "all_reduce":
            comm.all_reduce(x)
        else:
            comm.all_gather(np.zeros(n * comm.size, np.float32), x)
        return None
    except commlib.CommError as e:
        return f"{type(e).__name__}: {e}"


def dies_before_writing(comm, victim):
    """``victim`` is SIGKILLed before an exchange; the others wait on its slot and must raise
    PeerError naming it and the all_gather."""
    x = np.ones(4, np.float32)
    out = np.zeros(4 * comm.size, np.float32)
    comm.all_gather(out, x)
    comm.barrier()
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait(0.2)
    return survivor_outcome(lambda: comm.all_gather(out, x))


def wrapping_rings(comm, calls=120):
    """``calls`` rounds of an all_gather, an all_reduce, a broadcast of a rotating root and an
    all_to_all, the counts and values changing every call: each rank's slot ring (32 slots) wraps
    many times, the broadcasts share the rings' numbering, and the last rank sleeps now and then
    so the others run ahead up to the ring's bound (a slot is written again only once every peer
    passed the call it held). Returns the wrong calls seen by this rank (empty: all right)."""
    P, r = comm.size, comm.rank
    wrong = []
    for i in range(calls):
        if r == P - 1 and i % 40 == 5:
            threading.Event().wait(0.03)
        n = 1 + (i * 29) % (SLOT_BYTES // (4 * P))  # float32; all_to_all's P blocks still fit
        mine = np.arange(n, dtype=np.float32) + 1000 * i + 100 * r
        gathered = np.full(n * P, -1, np.float32)
        comm.all_gather(gathered, mine)
        want = np.concatenate([np.arange(n, dtype=np.float32) + 1000 * i + 100 * q for q in range(P)])
        if not np.array_equal(gathered, want):
            wrong.append(f"call {i}: all_gather on rank {r} got {gathered[:3].tolist()}...")
        summed = np.full(n, float(r + i), np.float64)
        comm.all_reduce(summed)
        if not np.array_equal(summed, np.full(n, float(sum(q + i for q in range(P))))):
            wrong.append(f"call {i}: all_reduce on rank {r} got {summed[:3].tolist()}...")
        root = i % P
        b = np.full(n, i, np.int32) if r == root else np.full(n, -1, np.int32)
        comm.broadcast(b, root=root)
        if not np.array_equal(b, np.full(n, i, np.int32)):
            wrong.append(f"call {i}: broadcast from {root} on rank {r} got {b[:3].tolist()}...")
        send = (np.arange(n * P, dtype=np.int64) + 10_000 * r + 1_000_000 * i)
        got = np.full(n * P, -1, np.int64)
        comm.all_to_all(got, send)
        want = np.concatenate([np.arange(r * n, (r + 1) * n, dtype=np.int64) + 10_000 * q + 1_000_000 * i
                               for q in range(P)])
        if not np.array_equal(got, want):
            wrong.append(f"call {i}: all_to_all on rank {r} got {got[:3].tolist()}...")
    return wrong[:4]
