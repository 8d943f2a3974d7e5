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


def _call(comm, coll, n, compress, algorithm, out_buf, in_buf):
    if coll == "all_reduce":
        np.copyto(out_buf, in_buf)
        return comm.all_reduce(out_buf, compress=compress, algorithm=algorithm)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(out_buf, in_buf, compress=compress, algorithm=algorithm)
    return comm.all_gather(out_buf, in_buf, compress=compress, algorithm=algorithm)


def compressed_calls_from_the_entry(comm, k=4):
    """all_reduce, reduce_scatter and all_gather with compress= (a Codec, and a codec's name with an
    algorithm named), awkward counts, float32 and float16: the first call of each key resolves in
    Python, the next k run from the entry. [(case, the Python path's resolutions during the k
    calls, entry hits, results bit for bit those of the Python path)] (the Python path's: the same
    calls with an equal Codec made anew each call, a key the entry never holds)."""
    P, r = comm.size, comm.rank
    out = []
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for n in (1, 13, 97):
            for dtype in ("float32", "float16"):
                for compress, algorithm in ((Codec("int8", block_size=8), "auto"), ("bf16", "ring")):
                    rng = np.random.default_rng(1000 * r + n)
                    in_n = n * P if coll == "reduce_scatter" else n
                    out_n = n * P if coll == "all_gather" else n
                    x = rng.standard_normal(in_n).astype(dtype)
                    y = np.zeros(out_n, dtype)
                    _call(comm, coll, n, compress, algorithm, y, x)  # resolved and added by the Python path
                    ref = np.zeros(out_n, dtype)
                    fresh = (lambda c=compress: Codec(c.name, c.block_size)) if isinstance(compress, Codec) else \
                        (lambda c=compress: Codec(c))
                    hits = _C.host_compressed_counts()[0]
                    with resolution_spy() as seen:
                        right = True
                        for _ in range(k):
                            _call(comm, coll, n, compress, algorithm, y, x)
                            y_entry = y.copy()
                            _call(comm, coll, n, fresh(), algorithm, ref, x)  # (a miss: the Python path)
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
