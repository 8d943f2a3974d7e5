"""Rank side of test_host_async_entry.py: async host calls through the C++ entry
(csrc/bindings/fast_call.cc run_host): all_to_all with split sizes, compress= calls and the other
collectives, with a spy on the Python route (Communicator._run, _all_to_allv) and the same calls
forced down the Python route (the module's entry declining everything) for the bit-for-bit check."""
import contextlib
import time

import numpy as np

import commlib
import commlib._C as _C
from commlib.codecs import Codec
from commlib.core.communicator import Communicator
from commlib.core.work import Work
from commlib.testing.faults import arm_death
from python_route import python_route_only

from compressed_entry_cases import call_compressed, compressed_call_shapes

# Awkward counts: none, one, fewer than the ranks, primes.
SIZES = [0, 1, 2, 3, 5, 13, 97]


@contextlib.contextmanager
def python_route_spy():
    """Calls that took the Python route inside the block: yields the list each appends its name to."""
    seen = []
    real = {name: getattr(Communicator, name) for name in ("_run", "_all_to_allv")}

    def spy(name):
        def f(self, *args, **kw):
            seen.append(name)
            return real[name](self, *args, **kw)
        return f
    for name in real:
        setattr(Communicator, name, spy(name))
    try:
        yield seen
    finally:
        for name, fn in real.items():
            setattr(Communicator, name, fn)


def _message(src, dst, n, salt):
    return np.arange(n, dtype=np.int64) * 7 + src * 1000 + dst * 100 + salt * 10000


def _a2av_calls(comm, salt, dtype):
    """One all_to_all with splits of a new shape: (input, output, input_splits, output_splits, expected)."""
    P, r = comm.size, comm.rank
    send = [[SIZES[(i * 3 + j * 5 + salt) % len(SIZES)] for j in range(P)] for i in range(P)]
    ins, outs = [send[r][j] for j in range(P)], [send[i][r] for i in range(P)]
    x = np.concatenate([_message(r, j, ins[j], salt) for j in range(P)]).astype(dtype)
    want = np.concatenate([_message(i, r, outs[i], salt) for i in range(P)]).astype(dtype)
    return x, np.full(sum(outs), -1, dtype), tuple(ins), list(outs), want


def async_a2av_from_the_entry(comm, rounds=4):
    """Async all_to_all with split sizes, six in flight at a time (zeros, ones, primes, fewer
    elements than ranks; int64 and float32): (Python route calls, entry's async a2av runs, calls
    made, every handle a Work, results exact, bytes equal to the Python route's)."""
    runs = _C.host_entry_counts()["all_to_allv_async"]
    made, right, works_ok, same = 0, True, True, True
    with python_route_spy() as seen:
        for rnd in range(rounds):
            calls = [_a2av_calls(comm, rnd * 3 + k, dtype) for k in range(3) for dtype in ("int64", "float32")]
            works = [comm.all_to_all(y, x, output_splits=outs, input_splits=ins, async_op=True)
                     for x, y, ins, outs, _ in calls]
            works_ok &= all(type(w) is Work for w in works)
            for w in works:
                w.wait()
            made += len(works)
            right &= all(np.array_equal(y, want) for _, y, _, _, want in calls)
    entry_runs = _C.host_entry_counts()["all_to_allv_async"] - runs
    # The Python route's own async batches of the same calls, byte for byte.
    for k in range(3):
        for dtype in ("int64", "float32"):
            x, y, ins, outs, _ = _a2av_calls(comm, 100 + k, dtype)
            y_ref = y.copy()
            comm.all_to_all(y, x, output_splits=outs, input_splits=ins, async_op=True).wait()
            with python_route_only():
                comm.all_to_all(y_ref, x, output_splits=outs, input_splits=ins, async_op=True).wait()
            same &= y.tobytes() == y_ref.tobytes()
    return len(seen), entry_runs, made, bool(works_ok), bool(right), bool(same)


def async_compressed_from_the_entry(comm, k=3):
    """all_reduce, reduce_scatter and all_gather with compress= and async_op=True (a Codec with auto,
    a codec's name with ring), counts 1, 2 and 13, float32 and float16: the first call of each key
    resolves on the Python route, the next k run from the entry. [(case, Python route calls during
    the k calls, entry runs, every handle a Work, bytes equal to the Python route's)]."""
    P, r = comm.size, comm.rank
    out = []
    for coll, n, dtype, compress, algorithm, x, out_n in compressed_call_shapes(P, r, (1, 2, 13)):
        y, ref = np.zeros(out_n, dtype), np.zeros(out_n, dtype)
        call_compressed(comm, coll, y, x, compress, algorithm, True).wait()  # resolved by Python
        hits = _C.host_compressed_counts()[0]
        runs = _C.host_entry_counts()["async"]
        works_ok, same = True, True
        with python_route_spy() as seen:
            ys = [np.zeros(out_n, dtype) for _ in range(k)]
            works = [call_compressed(comm, coll, ys[i], x, compress, algorithm, True) for i in range(k)]
            works_ok = all(type(w) is Work for w in works)
            for w in works:
                w.wait()
        with python_route_only():
            call_compressed(comm, coll, ref, x, compress, algorithm, True).wait()
        same = all(v.tobytes() == ref.tobytes() for v in ys)
        entry = (_C.host_compressed_counts()[0] - hits, _C.host_entry_counts()["async"] - runs)
        out.append(((coll, n, dtype, str(compress)[:12], algorithm), len(seen), entry, works_ok, same))
    return out


def async_collectives_from_the_entry(comm):
    """Every collective (no compress=) async through the entry, at counts 0, 1, P-1 and 13 (int64
    sums, exact), and barrier: [(collective, Python route calls, entry runs, handles Work, bytes equal to the
    Python route's)]."""
    P, r = comm.size, comm.rank
    out = []

    def calls(n):
        a = np.arange(n, dtype=np.int64) + 10 * r
        blk = np.arange(n * P, dtype=np.int64) + 100 * r
        root = (n + 1) % P
        return {
            "all_reduce": lambda: ((a.copy(),), lambda b, **kw: comm.all_reduce(b[0], **kw)),
            "all_gather": lambda: ((a, np.zeros(n * P, np.int64)), lambda b, **kw: comm.all_gather(b[1], b[0], **kw)),
            "reduce_scatter": lambda: ((blk, np.zeros(n, np.int64)),
                                       lambda b, **kw: comm.reduce_scatter(b[1], b[0], **kw)),
            "all_to_all": lambda: ((blk, np.zeros(n * P, np.int64)),
                                   lambda b, **kw: comm.all_to_all(b[1], b[0], **kw)),
            "broadcast": lambda: ((a.copy(),), lambda b, **kw: comm.broadcast(b[0], root=root, **kw)),
            "reduce": lambda: ((a.copy(),), lambda b, **kw: comm.reduce(b[0], root=root, **kw)),
            "gather": lambda: ((a, np.zeros(n * P if r == root else 0, np.int64)),
                               lambda b, **kw: comm.gather(b[1] if r == root else None, b[0], root=root, **kw)),
            "scatter": lambda: ((blk if r == root else None, np.zeros(n, np.int64)),
                                lambda b, **kw: comm.scatter(b[1], b[0], root=root, **kw)),
            "barrier": lambda: ((), lambda b, **kw: comm.barrier(**kw)),
        }
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                 "scatter", "barrier"):
        seen_n, runs_n, works_ok, same = 0, 0, True, True
        for n in (0, 1, P - 1, 13):
            bufs, call = calls(n)[coll]()
            ref_bufs = tuple(None if b is None else b.copy() for b in bufs)
            runs = _C.host_entry_counts()["async"]
            with python_route_spy() as seen:
                w = call(bufs, async_op=True)
                works_ok &= type(w) is Work
                w.wait()
            runs_n += _C.host_entry_counts()["async"] - runs
            seen_n += len(seen)
            with python_route_only():
                call(ref_bufs, async_op=True).wait()
            same &= all(b is None or b.tobytes() == c.tobytes() for b, c in zip(bufs, ref_bufs))
        out.append((coll, seen_n, runs_n, bool(works_ok), bool(same)))
    return out


def async_bad_arguments(comm):
    """After async entry calls, the same async calls with one argument wrong: all_to_all with
    splits (the shared table's cases), and compress= all_reduces: [(case, exception type, message,
    entry runs during it)]."""
    P, r = comm.size, comm.rank
    ins = [2] * P
    x, y = np.arange(2 * P, dtype=np.int64), np.zeros(2 * P, np.int64)
    codec = Codec("int8")
    f = np.ones(8, np.float32)
    for _ in range(2):
        comm.all_to_all(y, x, output_splits=ins, input_splits=ins, async_op=True).wait()
        comm.all_reduce(f, compress=codec, async_op=True).wait()
    other_self = list(ins)
    other_self[r], other_self[(r + 1) % P] = 1, 3
    a2a = dict(output_splits=ins, input_splits=ins, async_op=True)
    cases = {
        "input_splits length": lambda: comm.all_to_all(y, x, output_splits=ins, input_splits=ins[:-1], async_op=True),
        "output_splits sum": lambda: comm.all_to_all(y, x, output_splits=[3] * P, input_splits=ins, async_op=True),
        "negative split": lambda: comm.all_to_all(y, x, output_splits=ins, input_splits=[-1] + [2] * (P - 2) + [4],
                                                  async_op=True),
        "own block": lambda: comm.all_to_all(y, x, output_splits=ins, input_splits=other_self, async_op=True),
        "overlap": lambda: comm.all_to_all(x, x, **a2a),
        "dtype": lambda: comm.all_to_all(np.zeros(2 * P, np.int32), x, **a2a),
        "algorithm": lambda: comm.all_to_all(y, x, algorithm="nope", **a2a),
        "compress op": lambda: comm.all_reduce(f, op="band", compress=codec, async_op=True),
        "compress out": lambda: comm.all_reduce(f, out=np.ones(7, np.float32), compress=codec, async_op=True),
        "compress algorithm": lambda: comm.all_reduce(f, algorithm="nope", compress=codec, async_op=True),
    }
    out = []
    for case, bad in cases.items():
        runs = _C.host_entry_counts()
        try:
            w = bad()
            if w is not None:
                w.wait()
            out.append((case, None, None, 0))
        except (TypeError, ValueError) as e:
            after = _C.host_entry_counts()
            out.append((case, type(e).__name__, str(e), sum(after[k] - runs[k] for k in after)))
    return out


def kill_during_async_call(comm, victim, kind):
    """``victim`` dies (SIGKILL) under an async call made through the entry (``kind``: "a2av", an
    all_to_all with splits, or "compress", an all_reduce with compress=, both warmed up so that the
    entry runs them); the survivors' ``wait()`` must raise PeerError naming the dead rank and the
    call: (message, seconds), None on the victim; a wrong type is reported as such."""
    sub = comm.split(0, timeout=10)
    P = sub.size
    ins = [3] * P
    x, y = np.arange(3 * P, dtype=np.float32), np.zeros(3 * P, np.float32)
    codec = Codec("int8")
    f = np.ones(4096, np.float32)
    if kind == "a2av":
        call = lambda: sub.all_to_all(y, x, output_splits=ins, input_splits=ins, async_op=True)  # noqa: E731
    else:
        call = lambda: sub.all_reduce(f, compress=codec, algorithm="ring", async_op=True)  # noqa: E731
    call().wait()
    before = _C.host_entry_counts()["all_to_allv_async" if kind == "a2av" else "async"]
    # (an all_to_all's victim never makes the call: a rank sends its blocks at once, so a victim
    # inside the call could have delivered all its peers need before it dies)
    if arm_death(sub, victim) and kind == "a2av":
        time.sleep(5)  # the kill arrives meanwhile
    t = time.monotonic()
    try:
        w = call()
        if _C.host_entry_counts()["all_to_allv_async" if kind == "a2av" else "async"] != before + 1:
            return "wrong route: the call did not run from the entry", 0.0
        w.wait()
        if sub.rank == victim:
            time.sleep(5)  # the kill arrives meanwhile
        return "no error", time.monotonic() - t
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t
    except commlib.CommError as e:
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t
