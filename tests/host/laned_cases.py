"""Rank side of test_laned_calls.py: all_reduce's laned schedules (schedule/lanes.h: rail_window,
rail_lanes) on the host executor, which runs their lanes in flight (docs/DESIGN.md "Laned calls").

Every case runs the algorithm as the library resolves it (the executor's laned path where the call
has more than one lane) and checks it against NumPy as the collective matrix does
(collective_reference.py: exact for integers, the stated tolerances for floats); it also runs the
very same schedule registered as a Python algorithm, which the executor runs in list order (lanes.h:
a Python algorithm's lane fields are not lanes), and requires the two outputs bitwise equal: the
lanes touch disjoint elements (the verifier proves it), so each element is reduced in the same order
whichever lane runs first.
"""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np

import commlib
from commlib import _C
from collective_cases import Failures, HostBuffers, run_reducing
from collective_reference import BIG, DTYPES, big, ops_for, raw, report
from matrix_selection import covering, large_covering

ALGORITHMS = ("rail_window", "rail_lanes")
# COMMLIB_HIER_SEGMENT of the test's pools: rail_window's segments (a lane each: count / SEGMENT of
# them, at most 256) and rail_lanes' pipeline segment in each of its two lanes.
SEGMENT = 64


def counts(P):
    """Awkward counts: empty, one, fewer than the ranks and 13 (one lane everywhere: too few elements
    a segment), then 3, 15 and 256 of rail_window's lanes (64 * 3 + 5, the prime 1009, 40009), and
    at 4 ranks BIG (~1M, prime: 256 lanes of ~3900 elements, chunked)."""
    return sorted({0, 1, max(P - 1, 0), 13, 197, 1009, 40009} | ({BIG} if P == 4 else set()))


def _listed_name(algorithm):
    return f"{algorithm}_in_list_order"


def _register_listed(comm):
    """The library's own laned schedules as Python algorithms (run in list order)."""
    host_of = list(comm.topology.host_of)
    for algorithm in ALGORITHMS:
        def build(rank, size, count, root, algorithm=algorithm):
            s = _C.schedule(_C.Collective.all_reduce, algorithm, rank, size, count, root, _C.DType.int32, host_of)
            return {k: v for k, v in s.items() if k in ("steps", "scratch_count")}
        commlib.register_algorithm("all_reduce", _listed_name(algorithm), build)


def _unregister_listed():
    for algorithm in reversed(ALGORITHMS):  # (the last registered first: indices must not move)
        commlib.unregister_algorithm("all_reduce", _listed_name(algorithm))


def lanes_of(comm, algorithm, count):
    """The lanes the library gives `algorithm`'s all_reduce of `count` elements on this communicator."""
    return _C.schedule(_C.Collective.all_reduce, algorithm, comm.rank, comm.size, count, 0, _C.DType.int32,
                       list(comm.topology.host_of))["lanes"]


def selection(P):
    """{(algorithm, count, dtype): (op, in place) values}: a pairwise covering of the small counts'
    op x placement values, an each-choice covering at BIG (matrix_selection.py's rules)."""
    def values(cell):
        algorithm, count, dtype = cell
        places = (False,) if count >= 100_000 else (False, True)
        return [(op, inplace) for op in ops_for(dtype, count) for inplace in places]
    cells = [(a, c, d) for d in DTYPES for c in counts(P) for a in ALGORITHMS]
    small = [cell for cell in cells if cell[1] < 100_000]
    chosen = covering(small, values)
    chosen.update(large_covering([cell for cell in cells if cell[1] >= 100_000], values))
    return chosen


def check_laned(comm):
    """Every selected case, laned and in list order. Returns (failures, digests of every output,
    {count: lanes} of rail_window, and over the run the executor's steps_ahead, parked_bytes and
    parked_reads)."""
    P, r = comm.size, comm.rank
    failures, digests = Failures(), []
    counters = (comm._core.steps_ahead, comm._core.parked_bytes, comm._core.parked_reads)
    before = [c() for c in counters]
    _register_listed(comm)
    try:
        for (algorithm, count, dtype), cases in selection(P).items():
            for op, inplace in cases:
                what = (f"all_reduce {algorithm} ({lanes_of(comm, algorithm, count)} lanes) {dtype} {op} "
                        f"count={count} {'in-place' if inplace else 'out-of-place'} P={P} rank={r}")
                try:
                    out, want, mag = run_reducing(comm, HostBuffers, "all_reduce", algorithm, dtype, op, count, 0,
                                                  inplace)
                    listed, _, _ = run_reducing(comm, HostBuffers, "all_reduce", _listed_name(algorithm), dtype, op,
                                                count, 0, inplace)
                except Exception as e:  # noqa: BLE001 - report every case
                    failures.append(f"{what}: raised {type(e).__name__}: {e}")
                    continue
                if report(failures, what, dtype, out, want, mag, P):
                    digests.append((what.rsplit(" rank=", 1)[0], hashlib.sha1(raw(out)).hexdigest()))
                if raw(out) != raw(listed):
                    failures.append(f"{what}: differs bitwise from the same schedule run in list order")
    finally:
        _unregister_listed()
    lanes = {c: lanes_of(comm, "rail_window", c) for c in counts(P)}
    return (failures.listed(), digests, lanes) + tuple(c() - b for c, b in zip(counters, before))


def _step_lanes(comm, algorithm, count):
    s = _C.schedule(_C.Collective.all_reduce, algorithm, comm.rank, comm.size, count, 0, _C.DType.int32,
                    list(comm.topology.host_of))
    return s.get("step_lanes", [0] * len(s["steps"]))


def overlap_while_held(comm, algorithm, held_path, tag, count=4096, limit_s=30.0):
    """Rank 0 holds its sends of lane 0 (lane_hold.h) through one all_reduce of `algorithm`; every
    rank watches its executor's steps_ahead (steps finished while a step listed before them had
    not) until its steps of the other lanes all finished, or `limit_s` passed; then rank 0 lets go
    (once every rank reported) and the call completes. Returns (this rank's steps outside lane 0,
    steps ahead while the hold lasted, steps ahead by the call's end, whether the result is exact)."""
    from commlib.testing.faults import mark_reached, wait_until_reached

    P, r = comm.size, comm.rank
    others = sum(1 for lane in _step_lanes(comm, algorithm, count) if lane != 0)
    x = ((np.arange(count, dtype=np.int64) * 7 + r * 5) % 11 + 1).astype(np.int32)
    want = sum(((np.arange(count, dtype=np.int64) * 7 + q * 5) % 11 + 1) for q in range(P)).astype(np.int32)
    before = comm._core.steps_ahead()
    if r == 0:
        open(held_path, "w").close()
        _C.hold_lane_sends(0, held_path, limit_s * 2)
    try:
        work = comm.all_reduce(x, algorithm=algorithm, async_op=True)
        deadline = time.monotonic() + limit_s
        # rail_window's window holds some steps of the other lanes behind lane 0's: there the count
        # settles below `others`, so the wait ends when it stopped moving for a while.
        last, still_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            now = comm._core.steps_ahead() - before
            if now >= others:
                break
            if now != last:
                last, still_since = now, time.monotonic()
            elif now > 0 and time.monotonic() - still_since > 2.0:
                break
            time.sleep(0.01)
        while_held = comm._core.steps_ahead() - before
        mark_reached(comm, tag)
        if r == 0:
            wait_until_reached(comm, tag, range(P), limit_s=limit_s * 2)
            os.remove(held_path)
        work.wait()
    finally:
        if r == 0:
            _C.hold_lane_sends(0, "", 0)
    return others, while_held, comm._core.steps_ahead() - before, bool(np.array_equal(x, want))


def kill_in_laned_call(comm, victim, algorithm, count=1 << 16):
    """`victim` dies (SIGKILL) inside a laned all_reduce, the others in it too (faults.arm_death: the
    rank after the victim joins late, so the victim waits inside the call); returns the survivors'
    (message, seconds) (faults.survivor_outcome), None on the victim."""
    from commlib.testing.faults import arm_death, survivor_outcome

    sub = comm.split(0, timeout=20)
    x = np.ones(count, np.float32)
    sub.all_reduce(x, algorithm=algorithm)  # connected, warm
    assert lanes_of(sub, algorithm, count) > 1
    if arm_death(sub, victim):
        sub.all_reduce(x, algorithm=algorithm)
        time.sleep(10)  # the kill arrives meanwhile
        return None
    return survivor_outcome(lambda: sub.all_reduce(x, algorithm=algorithm))


def laned_over_stuttering_links(comm, rounds=2):
    """Integer all_reduces of both laned algorithms at 3 and 15 lanes, `rounds` times, over the toy
    transport's stuttering links inside each host (transport/toy/toy.h: every other send slot and
    received chunk not there yet, so sends and receives stop part way through messages of several
    lanes to one peer), exact and equal to list order. Returns failures."""
    P, r = comm.size, comm.rank
    failures = []
    _C.toy_transport(True)
    try:
        sub = comm.split(0)
        try:
            _register_listed(sub)
            _C.toy_transport_stutter(True)
            for _ in range(rounds):
                for algorithm in ALGORITHMS:
                    for count in (197, 1009):
                        x = ((np.arange(count, dtype=np.int64) * 7 + r * 5) % 11 + 1).astype(np.int32)
                        want = sum(((np.arange(count, dtype=np.int64) * 7 + q * 5) % 11 + 1)
                                   for q in range(P)).astype(np.int32)
                        listed = x.copy()
                        sub.all_reduce(x, algorithm=algorithm)
                        sub.all_reduce(listed, algorithm=_listed_name(algorithm))
                        if not (np.array_equal(x, want) and np.array_equal(listed, want)):
                            failures.append(f"{algorithm} count={count} rank={r}: not exact")
            links = set(sub.topology.links)
        finally:
            _C.toy_transport_stutter(False)
            _unregister_listed()
            sub.close()
    finally:
        _C.toy_transport(False)
    if "toy" not in links:
        failures.append(f"rank {r}: no toy link among {links}")
    return failures


def laned_single_copy(comm, lanes=4, rounds=3, eager=False):
    """rail_window and rail_lanes at BIG in `lanes` segments (COMMLIB_HIER_SEGMENT set so, on a
    communicator split for it): messages inside each host of ~0.5 MiB, single-copy under
    COMMLIB_CMA=1, several lanes' in flight to one peer; `eager`: parking every early chunk
    (_C.laned_park_eagerly). Returns (failures, single-copy sends, single-copy messages read when
    parked) of this rank."""
    P, r = comm.size, comm.rank
    failures = []
    saved = os.environ.get("COMMLIB_HIER_SEGMENT")
    os.environ["COMMLIB_HIER_SEGMENT"] = str(BIG // lanes)
    try:
        sub = comm.split(0)
        try:
            sub._core.enable_direct_reads()
            _register_listed(sub)
            sends, reads = sub._core.single_copy_sends(), sub._core.parked_reads()
            _C.laned_park_eagerly(eager)
            want = sum(((np.arange(BIG, dtype=np.int64) * 7 + q * 5) % 11 + 1) for q in range(P)).astype(np.int32)
            for _ in range(rounds):
                for algorithm in ALGORITHMS:
                    x = ((np.arange(BIG, dtype=np.int64) * 7 + r * 5) % 11 + 1).astype(np.int32)
                    listed = x.copy()
                    sub.all_reduce(x, algorithm=algorithm)
                    sub.all_reduce(listed, algorithm=_listed_name(algorithm))
                    if not (np.array_equal(x, want) and np.array_equal(listed, want)):
                        failures.append(f"{algorithm} ({lanes_of(sub, algorithm, BIG)} lanes) rank={r}: not exact")
            sends, reads = sub._core.single_copy_sends() - sends, sub._core.parked_reads() - reads
        finally:
            _C.laned_park_eagerly(False)
            _unregister_listed()
            sub.close()
    finally:
        if saved is None:
            os.environ.pop("COMMLIB_HIER_SEGMENT", None)
        else:
            os.environ["COMMLIB_HIER_SEGMENT"] = saved
    return failures, sends, reads


def mismatched_laned_calls(comm, count=4096):
    """Rank 0 calls rail_lanes, the others rail_window (both laned here), on a communicator split for
    it (a mismatch aborts it). Returns (the error's type and message, seconds it took)."""
    sub = comm.split(0, timeout=20)
    x = np.ones(count, np.int32)
    t = time.monotonic()
    try:
        sub.all_reduce(x, algorithm="rail_lanes" if sub.rank == 0 else "rail_window")
        return "no error", time.monotonic() - t
    except commlib.CommError as e:
        return f"{type(e).__name__}: {e}", time.monotonic() - t
    finally:
        sub.close()


# Channels in lanes (issue #39, session 27): rail_ring's channels (all_reduce, all_gather,
# reduce_scatter) and rail_split's parts (the rail rings' channels, hierarchical beside them), each a
# lane, which the host executor runs in flight as it does rail_lanes' and rail_window's.
CHANNELED = (("all_reduce", "rail_ring"), ("all_gather", "rail_ring"), ("reduce_scatter", "rail_ring"),
             ("all_reduce", "rail_split"))


def _register_channeled(comm):
    """The library's channel-laned schedules as Python algorithms of their collectives (list order)."""
    from commlib.core.call_spec import COLLECTIVE

    host_of = list(comm.topology.host_of)
    for collective, algorithm in CHANNELED:
        def build(rank, size, count, root, collective=collective, algorithm=algorithm):
            s = _C.schedule(COLLECTIVE[collective], algorithm, rank, size, count, root, _C.DType.int32, host_of)
            return {k: v for k, v in s.items() if k in ("steps", "scratch_count")}
        commlib.register_algorithm(collective, _listed_name(algorithm), build)


def _unregister_channeled():
    for collective, algorithm in reversed(CHANNELED):
        commlib.unregister_algorithm(collective, _listed_name(algorithm))


def channel_lanes_of(comm, collective, algorithm, count):
    from commlib.core.call_spec import COLLECTIVE

    return _C.schedule(COLLECTIVE[collective], algorithm, comm.rank, comm.size, count, 0, _C.DType.int32,
                       list(comm.topology.host_of))["lanes"]


def channel_counts(P, collective):
    """Empty, one, fewer than the ranks, 13, primes (fewer elements than channels included: 1 with
    up to 4 channels), and at 4 ranks ~1M elements a call (collective_reference.big: BIG, or BIG / P
    a block; every channel's messages chunked)."""
    return sorted({0, 1, max(P - 1, 0), 13, 197, 1009} | ({big(collective, P)} if P == 4 else set()))


def channel_selection(P):
    """{(collective, algorithm, count, dtype): (op, in place) values}: a pairwise covering of the small
    counts, an each-choice covering at BIG (op None for all_gather)."""
    def values(cell):
        collective, _, count, dtype = cell
        places = (False,) if count >= 100_000 else (False, True)
        ops = [None] if collective == "all_gather" else ops_for(dtype, count)
        return [(op, inplace) for op in ops for inplace in places]
    cells = [(c, a, n, d) for d in DTYPES for c, a in CHANNELED for n in channel_counts(P, c)]
    chosen = covering([cell for cell in cells if cell[2] < 100_000], values)
    chosen.update(large_covering([cell for cell in cells if cell[2] >= 100_000], values))
    return chosen


def _run_channeled(comm, collective, algorithm, dtype, op, count, inplace):
    """(result, reference, magnitudes) of one call (magnitudes None: exact)."""
    from collective_cases import run_moving

    if collective == "all_gather":
        out, want = run_moving(comm, HostBuffers, collective, algorithm, dtype, count, 0, inplace)
        return out, want, None
    return run_reducing(comm, HostBuffers, collective, algorithm, dtype, op, count, 0, inplace)


def check_channels(comm):
    """Every selected case of CHANNELED, laned and in list order, as check_laned. Returns (failures,
    digests, {(collective, algorithm): sorted lane counts met}, steps_ahead, parked_bytes over the run)."""
    P, r = comm.size, comm.rank
    failures, digests = Failures(), []
    counters = (comm._core.steps_ahead, comm._core.parked_bytes)
    before = [c() for c in counters]
    lanes = {}
    _register_channeled(comm)
    try:
        for (collective, algorithm, count, dtype), cases in channel_selection(P).items():
            W = channel_lanes_of(comm, collective, algorithm, count)
            lanes.setdefault(f"{collective} {algorithm}", set()).add(W)
            for op, inplace in cases:
                what = (f"{collective} {algorithm} ({W} lanes) {dtype} {op or ''} count={count} "
                        f"{'in-place' if inplace else 'out-of-place'} P={P} rank={r}")
                try:
                    out, want, mag = _run_channeled(comm, collective, algorithm, dtype, op, count, inplace)
                    listed, _, _ = _run_channeled(comm, collective, _listed_name(algorithm), dtype, op, count,
                                                  inplace)
                except Exception as e:  # noqa: BLE001 - report every case
                    failures.append(f"{what}: raised {type(e).__name__}: {e}")
                    continue
                # (every rank ends with the same output but in reduce_scatter, each its own block)
                if report(failures, what, dtype, out, want, mag, P) and collective != "reduce_scatter":
                    digests.append((what.rsplit(" rank=", 1)[0], hashlib.sha1(raw(out)).hexdigest()))
                if raw(out) != raw(listed):
                    failures.append(f"{what}: differs bitwise from the same schedule run in list order")
    finally:
        _unregister_channeled()
    return (failures.listed(), digests, {k: sorted(v) for k, v in lanes.items()}) + tuple(
        c() - b for c, b in zip(counters, before))


# Posted receives in laned calls (session 28): rail_ring's large plain receives over TCP land in their
# destination, as in list order, where the chunks that come next from that peer can only be theirs.
# Counts whose messages over TCP are past the executor's 64 KiB for landing in place on 2 hosts of 2
# (2 channels: a message is a block's half): all_gather and reduce_scatter's blocks, all_reduce's total.
LANDING_COUNTS = {"all_gather": 100_003, "reduce_scatter": 100_003, "all_reduce": 400_019}
LANDING_CALLS = 4


def laned_landing(comm):
    """rail_ring's three collectives, laned, LANDING_CALLS times each at LANDING_COUNTS (int32): exact,
    bitwise equal to the same schedule in list order, and the TCP links' bytes landed in place during
    the laned calls only. Returns (failures, {collective: bytes landed by the laned calls}, {collective:
    lanes})."""
    P, r = comm.size, comm.rank
    failures, landed, lanes = Failures(), {}, {}
    _register_channeled(comm)
    try:
        for collective, count in LANDING_COUNTS.items():
            lanes[collective] = channel_lanes_of(comm, collective, "rail_ring", count)
            op = None if collective == "all_gather" else "sum"
            what = f"{collective} rail_ring int32 count={count} P={P} rank={r}"
            listed, _, _ = _run_channeled(comm, collective, _listed_name("rail_ring"), "int32", op, count, False)
            comm.barrier()
            before = comm._core.tcp_stats()["landed"]
            for _ in range(LANDING_CALLS):
                out, want, mag = _run_channeled(comm, collective, "rail_ring", "int32", op, count, False)
                report(failures, what, "int32", out, want, mag, P)
                if raw(out) != raw(listed):
                    failures.append(f"{what}: differs bitwise from the same schedule run in list order")
            landed[collective] = comm._core.tcp_stats()["landed"] - before
            comm.barrier()
    finally:
        _unregister_channeled()
    return failures.listed(), landed, lanes
