"""Rank-side checks for the pipelined hierarchical all_reduce (COMMLIB_HIER_SEGMENT set small so a
few thousand elements span several segments): integer values must be exact, random floats must
come out bitwise identical on every rank (the same reduction order everywhere)."""
from __future__ import annotations

import hashlib

import numpy as np


def pipelined_all_reduce(comm, counts):
    """For each count: [exact integer result in place, exact out of place, sha256 of float result,
    sha256 of this rank's schedule as built here (the rank's COMMLIB_HIER_SEGMENT and host map)]."""
    import commlib._C as _C

    P, r = comm.size, comm.rank
    out = []
    for count in counts:
        ints = ((np.arange(count, dtype=np.int64) * 5 + r * 3) % 13 + 1).astype(np.int32)
        want = sum(((np.arange(count, dtype=np.int64) * 5 + q * 3) % 13 + 1) for q in range(P)).astype(np.int32)
        inplace = ints.copy()
        comm.all_reduce(inplace, algorithm="hierarchical")
        dst = np.zeros_like(ints)
        comm.all_reduce(ints, algorithm="hierarchical", out=dst)
        floats = np.random.default_rng(1000 * r + count).standard_normal(count).astype(np.float32)
        comm.all_reduce(floats, algorithm="hierarchical")
        out.append([bool(np.array_equal(inplace, want)), bool(np.array_equal(dst, want)),
                    hashlib.sha256(floats.tobytes()).hexdigest(),
                    schedule_digest(_C.schedule(_C.Collective.all_reduce, "hierarchical", r, P, count, 0, _C.DType.int32,
                                                comm.topology.host_of))])
    return out


def schedule_digest(schedule) -> str:
    return hashlib.sha256(repr(schedule).encode()).hexdigest()
