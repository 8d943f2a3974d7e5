"""Rank-side checks for the overlapped hierarchical all_reduce (schedule/hierarchical_overlap.cc)
run by the host executor: each composition is registered as a Python algorithm whose builder
returns the library's own hierarchical schedule for this communicator's host map (so the engine
runs exactly what the verifier proves), then called in place and out of place on small integers,
which must come out exact."""
from __future__ import annotations

import numpy as np

import commlib
from commlib import _C

SEGMENT = 64  # elements: the counts below span 3 to 16 segments


def _builder(host_of, inter, intra, algorithm="hierarchical"):
    # rail_lanes: two lanes on halves of the buffer, each pipelined in segments of its own (half as
    # long, so that each lane spans as many segments as the others' whole buffer)
    segment = SEGMENT // 2 if algorithm == "rail_lanes" else SEGMENT

    def build(rank, size, count, root):
        return _C.schedule(_C.Collective.all_reduce, algorithm, rank, size, count, root, _C.DType.int32, host_of,
                           inter, segment, intra)
    return build


def mixed_steps(host_of, rank, sched) -> int:
    """Steps of `sched` holding a message to another host and one within this rank's host."""
    def where(op):
        return host_of[op["peer"]] == host_of[rank]
    return sum(1 for st in sched["steps"] if len({where(o) for o in st if o["peer"] is not None}) == 2)


def run(comm, pairs, counts):
    """For each (inter, intra[, algorithm]) pair (algorithm: hierarchical, or rail_split: rail rings
    beside it on the default share) and count: [exact in place, exact out of place, mixed steps of
    this rank's schedule]."""
    P, r = comm.size, comm.rank
    host_of = list(comm.topology.host_of)
    names = []
    out = []
    try:
        for inter, intra, *algorithm in pairs:
            build = _builder(host_of, inter, intra, *algorithm)
            name = f"overlap_{inter}_{intra or 'builtin'}_{''.join(algorithm)}"
            commlib.register_algorithm("all_reduce", name, build)
            names.append(name)
            for count in counts:
                ints = ((np.arange(count, dtype=np.int64) * 7 + r * 5) % 11 + 1).astype(np.int32)
                want = sum(((np.arange(count, dtype=np.int64) * 7 + q * 5) % 11 + 1) for q in range(P)).astype(np.int32)
                inplace = ints.copy()
                comm.all_reduce(inplace, algorithm=name)
                dst = np.zeros_like(ints)
                comm.all_reduce(ints, algorithm=name, out=dst)
                sched = build(r, P, count, 0)
                out.append([bool(np.array_equal(inplace, want)), bool(np.array_equal(dst, want)),
                            mixed_steps(host_of, r, sched)])
    finally:
        for name in reversed(names):
            commlib.unregister_algorithm("all_reduce", name)
    return out
