"""Rank side of test_compressed_entry.py: host collectives with compress= through the C++ entry
(csrc/bindings/host_compressed_calls.cc), with a spy on the Python path's codec resolution
(core/codecs.py compressed_call, as communicator.py calls it)."""
import contextlib

import numpy as np

import commlib
import commlib._C as _C
from commlib.codecs import Codec
from commlib.core import communicator


@contextlib.contextmanager
def resolution_spy():
    """The Python path's compressed calls inside the block (communicator.compressed_call): yields
    the list each appends its collective to."""
    seen = []
    real = communicator.compressed_call

    def spy(core, size, coll, *args):
        seen.append(coll)
        return real(core, size, coll, *args)
    communicator.compressed_call = spy
    try:
        yield seen
    finally:
        communicator.compressed_call = real


def call_compressed(comm, coll, out_buf, in_buf, compress, algorithm, async_op=False):
    """One compress= call of `coll` (all_reduce reduces `in_buf` copied into `out_buf`)."""
    if coll == "all_reduce":
        np.copyto(out_buf, in_buf)
        return comm.all_reduce(out_buf, compress=compress, algorithm=algorithm, async_op=async_op)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(out_buf, in_buf, compress=compress, algorithm=algorithm, async_op=async_op)
    return comm.all_gather(out_buf, in_buf, compress=compress, algorithm=algorithm, async_op=async_op)


def compressed_call_shapes(P, r, sizes):
    """The compressed calls the entry tests make on rank r of P: all_reduce, reduce_scatter and
    all_gather at each count in `sizes`, float32 and float16, a Codec with auto and a codec's name
    with ring. Yields (coll, n, dtype, compress, algorithm, x, out_n): x is the rank's seeded input
    (n * P long for reduce_scatter), out_n the output's length (n * P for all_gather)."""
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for n in sizes:
            for dtype in ("float32", "float16"):
                for compress, algorithm in ((Codec("int8", block_size=8), "auto"), ("bf16", "ring")):
                    rng = np.random.default_rng(1000 * r + n)
                    in_n = n * P if coll == "reduce_scatter" else n
                    out_n = n * P if coll == "all_gather" else n
                    yield coll, n, dtype, compress, algorithm, rng.standard_normal(in_n).astype(dtype), out_n


def compressed_calls_from_the_entry(comm, k=4):
    """all_reduce, reduce_scatter and all_gather with compress= (a Codec, and a codec's name with an
    algorithm named), awkward counts, float32 and float16: the first call of each key resolves in
    Python, the next k run from the entry. [(case, the Python path's resolutions during the k
    calls, entry hits, results bit for bit those of the Python path)] (the Python path's: the same
    calls with an equal Codec made anew each call, a key the entry never holds)."""
    P, r = comm.size, comm.rank
    out = []
    for coll, n, dtype, compress, algorithm, x, out_n in compressed_call_shapes(P, r, (1, 13, 97)):
        y = np.zeros(out_n, dtype)
        call_compressed(comm, coll, y, x, compress, algorithm)  # resolved and added by the Python path
        ref = np.zeros(out_n, dtype)
        fresh = (lambda c=compress: Codec(c.name, c.block_size)) if isinstance(compress, Codec) else \
            (lambda c=compress: Codec(c))
        hits = _C.host_compressed_counts()[0]
        with resolution_spy() as seen:
            right = True
            for _ in range(k):
                call_compressed(comm, coll, y, x, compress, algorithm)
                y_entry = y.copy()
                call_compressed(comm, coll, ref, x, fresh(), algorithm)  # (a miss: the Python path)
                right &= y_entry.tobytes() == ref.tobytes()
        hits = _C.host_compressed_counts()[0] - hits
        out.append(((coll, n, dtype, str(compress)[:20], algorithm), len(seen) - k, hits, right))
    return out


def compressed_entry_refusals(comm):
    """After entry hits of an all_reduce with compress=, the same call with a wrong argument, and
    after its communicator closed: [(case, error type, message, entry hits during it, entries the
    entry dropped during it)]."""
    sub = comm.split(0, timeout=30)
    codec = Codec("int8")
    x = np.ones(8, np.float32)
    for _ in range(3):
        sub.all_reduce(x, compress=codec)
    cases = {
        "op": lambda: sub.all_reduce(x, op="band", compress=codec),
        "out": lambda: sub.all_reduce(x, out=np.ones(7, np.float32), compress=codec),
        "algorithm": lambda: sub.all_reduce(x, algorithm="nope", compress=codec),
        "closed": lambda: (sub.close(), sub.all_reduce(x, compress=codec)),
    }
    out = []
    try:
        for case, bad in cases.items():
            hits, held = _C.host_compressed_counts()
            try:
                bad()
                error = (None, None)
            except (TypeError, ValueError, commlib.CommError, RuntimeError) as e:
                error = (type(e).__name__, str(e))
            out.append((case, *error, _C.host_compressed_counts()[0] - hits, held - _C.host_compressed_counts()[1]))
    finally:
        sub.close()
    return out
