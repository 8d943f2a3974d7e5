"""Rank-side checks of compress_inter_only (Codec(inter_only=True), docs/compression.md) on ranks
spread over emulated hosts: every rank ends bitwise identical, within the codec's bound of the
exact result, and the messages between hosts really are encoded (int4 results are not exact);
on one host nothing is encoded, so the result equals the uncompressed one bit for bit."""
from __future__ import annotations

import hashlib

import numpy as np

from commlib.codecs import Codec

COUNTS = (0, 1, 37, 1000)
EPS = {"int4": 1 / 7}  # the coarsest codec: its error is never hidden by float32 rounding


def _inputs(rank: int, n: int) -> np.ndarray:
    return (np.random.default_rng(7 * rank + n).standard_normal(n) * (1 + rank)).astype(np.float32)


def across_hosts(comm):
    """Returns (failures, [(case, digest)], all_reduce cases that differ from the uncompressed call) for the three collectives x algorithms
    the verifier proves under inter_only on this host map."""
    p, r = comm.size, comm.rank
    failures, digests, inexact = [], [], []
    for name in EPS:
        codec = Codec(name, block_size=16, inter_only=True)
        for algo in ("auto", "hierarchical", "direct", "ring"):
            for n in COUNTS:
                # direct and ring: all_gather's (whose blocks go raw to one peer and encoded to
                # another unless projected first); the verifier refuses direct all_reduce here
                for coll in ("all_reduce", "reduce_scatter", "all_gather") if algo in ("auto", "hierarchical") \
                        else ("all_gather",):
                    per = n * p if coll == "reduce_scatter" else n
                    xs = [_inputs(q, per) for q in range(p)]
                    case = f"{coll} {algo} {name} n={n}"
                    if coll == "all_reduce":
                        out = xs[r].copy()
                        comm.all_reduce(out, algorithm=algo, compress=codec)
                        plain = xs[r].copy()
                        comm.all_reduce(plain, algorithm="hierarchical")  # what auto runs on 2 x 2
                        if not np.array_equal(out, plain):
                            inexact.append(case)
                        exact, scale = np.sum(xs, 0, dtype=np.float64), np.sum(np.abs(xs), 0, dtype=np.float64)
                    elif coll == "reduce_scatter":
                        out = np.zeros(n, np.float32)
                        comm.reduce_scatter(out, xs[r], algorithm=algo, compress=codec)
                        sl = slice(r * n, (r + 1) * n)
                        exact = np.sum(xs, 0, dtype=np.float64)[sl]
                        scale = np.sum(np.abs(xs), 0, dtype=np.float64)[sl]
                    else:
                        out = np.zeros(n * p, np.float32)
                        comm.all_gather(out, xs[r], algorithm=algo, compress=codec)
                        exact = np.concatenate(xs).astype(np.float64)
                        scale = np.full(n * p, max((np.abs(x).max() for x in xs if x.size), default=0.0))
                    # every encoding adds at most eps x its block's largest magnitude (<= the
                    # largest partial sum anywhere: scale's max), once per host crossing + projection
                    bound = (p + 1) * (EPS[name] + 2 ** -23) * (scale.max() if n else 0)
                    err = np.abs(out.astype(np.float64) - exact)
                    if n and err.max() > bound:
                        failures.append(f"{case}: error {err.max()} > bound {bound}")
                    if coll != "reduce_scatter":
                        digests.append((case, hashlib.sha1(out.tobytes()).hexdigest()))
    return failures, digests, inexact


def one_host_is_exact(comm):
    """On one host inter_only encodes nothing: the results equal the uncompressed calls'."""
    p, r = comm.size, comm.rank
    differ = []
    for algo in ("ring", "recursive_doubling", "direct"):
        x = _inputs(r, 1000)
        a, b = x.copy(), x.copy()
        comm.all_reduce(a, algorithm=algo, compress=Codec("int4", inter_only=True))
        comm.all_reduce(b, algorithm=algo)
        if not np.array_equal(a, b):
            differ.append(f"all_reduce {algo}")
        # out of place: the raw recv_reduce reduces from the input into the output (the executor's
        # own path since session 18, no staging copy)
        a, b = np.zeros_like(x), np.zeros_like(x)
        comm.all_reduce(x, out=a, algorithm=algo, compress=Codec("int4", inter_only=True))
        comm.all_reduce(x, out=b, algorithm=algo)
        if not np.array_equal(a, b):
            differ.append(f"all_reduce {algo} out of place")
        out_a, out_b = np.zeros(1000 * p, np.float32), np.zeros(1000 * p, np.float32)
        comm.all_gather(out_a, x, algorithm="ring", compress=Codec("int4", inter_only=True))
        comm.all_gather(out_b, x, algorithm="ring")
        if not np.array_equal(out_a, out_b):
            differ.append(f"all_gather ring after all_reduce {algo}")
    return differ
