"""Rank side of test_host_a2av_entry.py: all_to_all with split sizes on host buffers through the
C++ entry (csrc/bindings/fast_call.cc run_host_all_to_allv), with a spy on the Python path's
batch (Communicator._all_to_allv)."""
import contextlib

import numpy as np

import commlib._C as _C
from commlib.core.communicator import Communicator


@contextlib.contextmanager
def python_path_spy():
    seen = []
    real = Communicator._all_to_allv

    def spy(self, *args, **kw):
        seen.append(1)
        return real(self, *args, **kw)
    Communicator._all_to_allv = spy
    try:
        yield seen
    finally:
        Communicator._all_to_allv = real


def _message(src, dst, n, salt):
    return (np.arange(n, dtype=np.int64) * 7 + src * 1000 + dst * 100 + salt * 10000)


def host_a2av_from_the_entry(comm, calls=6):
    """all_to_all with splits of a new shape at every call (zeros, ones, primes, fewer elements
    than ranks), int64 and float32, lists and tuples: (the Python path's batches, the entry's
    declines, calls made, results right)."""
    P, r = comm.size, comm.rank
    sizes = [0, 1, 2, 3, 5, 13, 97]
    declined, right, made = _C.fast_path_counts()[1], True, 0
    with python_path_spy() as seen:
        for salt in range(calls):
            send = [[sizes[(i * 3 + j * 5 + salt) % len(sizes)] for j in range(P)] for i in range(P)]
            ins, outs = [send[r][j] for j in range(P)], [send[i][r] for i in range(P)]
            for dtype in ("int64", "float32"):
                x = np.concatenate([_message(r, j, ins[j], salt) for j in range(P)]).astype(dtype)
                y = np.full(sum(outs), -1, dtype)
                comm.all_to_all(y, x, output_splits=list(outs), input_splits=tuple(ins))
                made += 1
                right &= np.array_equal(y, np.concatenate([_message(i, r, outs[i], salt) for i in range(P)]).astype(dtype))
    return len(seen), _C.fast_path_counts()[1] - declined, made, bool(right)


def host_a2av_bad_arguments(comm):
    """After entry calls, the same call with one argument wrong: [(case, exception type, message)]."""
    P, r = comm.size, comm.rank
    ins = [2] * P
    x, y = np.arange(2 * P, dtype=np.int64), np.zeros(2 * P, np.int64)
    for _ in range(2):
        comm.all_to_all(y, x, output_splits=ins, input_splits=ins)
    other_self = list(ins)
    other_self[r], other_self[(r + 1) % P] = 1, 3
    cases = {
        "input_splits length": lambda: comm.all_to_all(y, x, output_splits=ins, input_splits=ins[:-1]),
        "output_splits sum": lambda: comm.all_to_all(y, x, output_splits=[3] * P, input_splits=ins),
        "negative split": lambda: comm.all_to_all(y, x, output_splits=ins, input_splits=[-1] + [2] * (P - 2) + [4]),
        "own block": lambda: comm.all_to_all(y, x, output_splits=ins, input_splits=other_self),
        "overlap": lambda: comm.all_to_all(x, x, output_splits=ins, input_splits=ins),
        "dtype": lambda: comm.all_to_all(np.zeros(2 * P, np.int32), x, output_splits=ins, input_splits=ins),
        "algorithm": lambda: comm.all_to_all(y, x, output_splits=ins, input_splits=ins, algorithm="nope"),
    }
    out = []
    for case, bad in cases.items():
        try:
            bad()
            out.append((case, None, None))
        except (TypeError, ValueError) as e:
            out.append((case, type(e).__name__, str(e)))
    return out
