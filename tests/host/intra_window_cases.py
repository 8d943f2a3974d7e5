"""Rank side of test_laned_calls.py's intra-window case: rail_window's intra window (ir.h
Schedule::intra_window E, session 32) on the host executor, as auto picks it under a cost model.

Nothing on a communicator names E: auto's model chooses rail_window's shape (policy/window_shapes.cc),
so the case sets COMMLIB_TOPOLOGY (the pool's env), asks the engine's own resolution for a size where
the model picks the intra-window shape, runs that call with auto, and checks it exactly, bitwise
against the same schedule run in list order (a Python algorithm: lanes.h, no lanes, so no window),
and by the executor's count of the window's steps in flight at once (at most E where it is honoured).
"""
from __future__ import annotations

import numpy as np

import commlib
from commlib import _C, settings, tuning
from commlib.sim import topology as sim_topology

# 16 MiB of int32 on 8 ranks in 2 hosts of 4: dgx-h100's model picks rail_window with K 128
# segments, direct intra phases and E 3 (checked by the case, which reports the resolution).
COUNT = 1 << 22
LISTED = "rail_window_intra_window_in_list_order"


def run(comm, count=COUNT):
    """(resolution {algorithm, E, intra, segment}, auto's choice on the communicator, exact (twice),
    bitwise equal to list order, steps ahead of list order in the laned call, the most windowed steps
    in flight at once on this rank, heap allocations of commlib's C++ on this thread in the same call
    made again)."""
    # The pool's processes installed this machine's tuning table when they imported commlib; the
    # table would win over the model where it has the shape (policy/auto_policy.h).
    _C.clear_tuning()
    try:
        return _run(comm, count)
    finally:
        tuning.load_default()


def _run(comm, count):
    P, r = comm.size, comm.rank
    hosts = list(comm._core.host_of)
    model = sim_topology.load(settings.get("COMMLIB_TOPOLOGY")).engine_dict(P)
    k = _C.resolve_algorithm(_C.Collective.all_reduce, "auto", count, 4, 0, P, hosts, model)
    base = np.arange(count, dtype=np.int64) * 7
    x = ((base + r * 5) % 11 + 1).astype(np.int32)
    want = sum((base + q * 5) % 11 + 1 for q in range(P)).astype(np.int32)
    ahead0 = comm._core.steps_ahead()
    out = x.copy()
    comm.all_reduce(out)  # auto: the engine resolves it on the same model and host map
    ahead = comm._core.steps_ahead() - ahead0
    in_flight = comm._core.intra_in_flight_max()
    again = x.copy()
    comm.all_reduce(again)  # (a queue may still grow to its steady size here: ring_queue.h)
    again = x.copy()
    allocated = _C.thread_allocations()
    comm.all_reduce(again)  # the same call again: its plan, gates, lowered steps and tables kept
    allocated = _C.thread_allocations() - allocated

    def build(rank, size, n, root):
        s = _C.schedule(_C.Collective.all_reduce, k["algorithm"], rank, size, n, root, _C.DType.int32, hosts,
                        k["inter_algorithm"], k["segment"], k["intra_algorithm"], k["pieces"], k["share"])
        assert s.get("intra_window", 0) == k["share"] >> 24, s.get("intra_window")
        return {key: v for key, v in s.items() if key in ("steps", "scratch_count")}

    commlib.register_algorithm("all_reduce", LISTED, build)
    try:
        listed = x.copy()
        comm.all_reduce(listed, algorithm=LISTED)
    finally:
        commlib.unregister_algorithm("all_reduce", LISTED)
    resolution = {"algorithm": k["algorithm"], "E": k["share"] >> 24, "intra": k["intra_algorithm"],
                  "segment": k["segment"]}
    chose = comm._core.auto_choice(_C.Collective.all_reduce, count * 4, 4)
    return (resolution, chose, bool(np.array_equal(out, want) and np.array_equal(again, want)),
            bool(np.array_equal(out, listed)), ahead, in_flight, allocated)
