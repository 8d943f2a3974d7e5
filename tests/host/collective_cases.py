"""Rank-side checks of every collective x algorithm x dtype x op x count against NumPy, on the host
route (NumPy arrays; bfloat16 as torch views of collective_reference's bit patterns).

Inputs, references and the stated float tolerances are collective_reference.py's. Results come
back as failure descriptions plus a digest of every output that must be bitwise identical across
ranks; the pytest side compares the digests. A rank keeps making every call after it found a
failure (it only stops recording them past MAX_RECORDED): a rank that stopped early would leave its
peers waiting out the collective's timeout, so a regression would cost minutes before it failed.
"""
from __future__ import annotations

import functools
import hashlib
import time

import numpy as np

import commlib
from collective_reference import (BF16, BIG, DTYPES, FLOAT_OPS, INT_OPS, INTS, ITEM_BYTES, PREMUL, big,  # noqa: F401
                                  counts_for, empty, make, moving_expected, moving_input, ops_for, raw,
                                  reduce_ref_for, report, rounded, values)
from matrix_selection import FULL_LARGE_AT, selected

MAX_RECORDED = 20
# The large count (~1M elements) and the in-place cut-off: counts_for's values are 0, 1, P - 1, 13, ~1M.
LARGE = 100_000


class Failures(list):
    """The failures a rank records: the first MAX_RECORDED, then a count of the rest (the calls go
    on: see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.unrecorded = 0

    def append(self, text):
        if len(self) < MAX_RECORDED:
            super().append(text)
        else:
            self.unrecorded += 1

    def listed(self) -> list:
        """A plain list (what the rank sends back), led by how many more were not listed (the
        test shows the first lines)."""
        extra = [f"{self.unrecorded} more failure(s) on this rank than listed here"] if self.unrecorded else []
        return extra + list(self)


def _torch():
    import torch
    return torch


class HostBuffers:
    """The buffer factory of the host cases: NumPy arrays; bfloat16 bit patterns are handed to the
    communicator as torch bfloat16 views of the same memory (NumPy has no bfloat16). The device
    cases (tests/stream/device_cases.py) pass one of commlib.emulated arrays to the same case
    functions."""

    @staticmethod
    def _host(a):
        if isinstance(a, BF16):
            torch = _torch()
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return a

    @staticmethod
    def make(dtype, v):
        return HostBuffers._host(make(dtype, v))

    @staticmethod
    def empty(dtype, n):
        return HostBuffers._host(empty(dtype, n))

    @staticmethod
    def to_host(x, dtype):
        if dtype == "bfloat16":
            return x.view(_torch().int16).numpy().view(np.uint16).view(BF16)
        return x

    @staticmethod
    def assign(dst, src):
        dst[:] = src

def run_reducing(comm, buffers, collective, algo, dtype, op, count, root, inplace):
    """One all_reduce / reduce_scatter / reduce on ``buffers``' arrays. Returns (the result on the
    host, or None on a rank that gets none, the reference, its magnitudes for the tolerance)."""
    P, r = comm.size, comm.rank
    scale = PREMUL if op == "premul_sum" else None
    n_in = count * P if collective == "reduce_scatter" else count
    x = buffers.make(dtype, values(dtype, op, r, n_in))
    if collective == "reduce" and r != root:
        want = mag = None  # this rank gets no result to check
    elif collective == "reduce_scatter":
        want, mag = reduce_ref_for(dtype, op, n_in, P, r * count, (r + 1) * count)
    else:
        want, mag = reduce_ref_for(dtype, op, n_in, P)
    if collective == "all_reduce":
        out = x if inplace else buffers.empty(dtype, count)
        comm.all_reduce(x, op=op, algorithm=algo, out=None if inplace else out, scale=scale)
    elif collective == "reduce":
        out = x if inplace else buffers.empty(dtype, count)
        comm.reduce(x, root=root, op=op, algorithm=algo, out=None if inplace else out, scale=scale)
    else:
        out = x[r * count:(r + 1) * count] if inplace else buffers.empty(dtype, count)
        comm.reduce_scatter(out, x, op=op, algorithm=algo, scale=scale)
    if collective == "reduce" and r != root:
        return None, want, mag
    return buffers.to_host(out, dtype), want, mag


# The multi-channel rings, the double tree and the grid (issue 39) run up to 4 ranks only (the full
# product at 3): the matrix's ranks share one host, where rail_ring is a ring and its reverse side by
# side at every P >= 3, the double tree's second tree is mirrored at even P and shifted at odd P, and
# the grid is 2 x 2 at 4 ranks (a plain two-shot at 3, prime), so 3 and 4 ranks hold every shape
# they take here (the ~1M-element counts cut the grid into its pieces); at 5 and 8 ranks they would
# add algorithms to the slowest cells (all_reduce-5 and -8). Their multi-host shapes are proven by
# the verifier (tests/schedule/test_rail_ring.py, test_grid.py, test_verify_all.py). rail_split: 3 ranks
# hold its one-host shape (two messages of a pair in a step); tests/multihost/test_overlapped_hierarchical.py runs it (and rail_halving, rail_lanes, rail_window: one lane on one host) across hosts.
SMALL_WORLDS_ONLY = {"rail_ring": 4, "double_tree": 4, "grid": 4, "rail_split": 3, "rail_halving": 4, "rail_lanes": 4, "rail_window": 4}


def algorithms_at(collective, P):
    """The registered algorithms of ``collective`` the matrix runs at ``P`` ranks."""
    return [a for a in commlib.algorithms(collective) if P <= SMALL_WORLDS_ONLY.get(a, P)]


def algos_for(collective, dtype, P):
    """Every algorithm of ``collective`` run at ``P`` ranks; "auto" on float32 only."""
    algos = ["auto"] + algorithms_at(collective, P)
    return algos if dtype == "float32" else algos[1:]


def placements(collective, count):
    """In place (True) and out of place (False), where the collective has both at ``count``:
    broadcast has no out-of-place form; the ~1M-element reductions, all_to_all, scatter and
    gather run out of place only (their in-place paths are the small counts')."""
    if collective == "broadcast":
        return (True,)
    if count >= LARGE and collective in ("all_reduce", "reduce_scatter", "reduce", "all_to_all", "scatter", "gather"):
        return (False,)
    return (False, True)


def reducing_values(collective, cell):
    """The (op, in place) values the full product runs in ``cell`` = (algorithm, count, dtype)."""
    return [(op, inplace) for op in ops_for(cell[2], cell[1]) for inplace in placements(collective, cell[1])]


@functools.lru_cache(maxsize=None)  # a handful of (collective, P) keys per process
def reducing_selection(collective, P, thinned=False):
    """{(algorithm, count, dtype): (op, in place) values}: the full product at 3 ranks, a
    pairwise covering selection of the values elsewhere; the large count's full product at 3 ranks,
    an each-choice covering elsewhere (matrix_selection.py says which and why)."""
    cells = [(algo, count, dtype) for dtype in DTYPES for count in counts_for(P, collective)
             for algo in algos_for(collective, dtype, P)]
    return selected(P, cells, functools.partial(reducing_values, collective), is_large=lambda cell: cell[1] >= LARGE,
                    thinned=thinned)


def check_reducing(comm, collective, large_only=False, small_only=False):
    """all_reduce / reduce_scatter / reduce over every algorithm, dtype, op, count, root and
    placement (the op x placement values thinned to a pairwise covering away from 3 ranks:
    reducing_selection)."""
    P, r = comm.size, comm.rank
    failures, digests = Failures(), []
    roots = sorted({0, P - 1}) if collective == "reduce" else [0]
    selection = reducing_selection(collective, P, large_only)
    # The algorithm varies fastest so the cached inputs and references are reused.
    for dtype in DTYPES:
        for count in counts_for(P, collective):
            if (large_only and count < LARGE) or (small_only and count >= LARGE):
                continue
            for op in ops_for(dtype, count):
                for root in roots:
                    for algo in algos_for(collective, dtype, P):
                        for inplace in placements(collective, count):
                            if (op, inplace) not in selection[(algo, count, dtype)]:
                                continue
                            what = (f"{collective} {algo} {dtype} {op} count={count} root={root} "
                                    f"{'in-place' if inplace else 'out-of-place'} P={P} rank={r}")
                            try:
                                out, want, mag = run_reducing(comm, HostBuffers, collective, algo, dtype, op, count,
                                                              root, inplace)
                            except Exception as e:  # noqa: BLE001 - report every case
                                failures.append(f"{what}: raised {type(e).__name__}: {e}")
                                continue
                            if out is None:
                                continue
                            if report(failures, what, dtype, out, want, mag, P) and collective == "all_reduce":
                                digests.append((what.rsplit(" rank=", 1)[0], hashlib.sha1(raw(out)).hexdigest()))
    return failures.listed(), digests


def run_moving(comm, buffers, collective, algo, dtype, count, root, inplace):
    """One all_gather / all_to_all / broadcast / gather / scatter on ``buffers``' arrays. Returns
    (the result on the host, or None on a rank that gets none, the expected result)."""
    P, r = comm.size, comm.rank
    want = moving_expected(collective, dtype, count, root, r, P)
    x = buffers.make(dtype, moving_input(collective, dtype, count, P, r))
    if collective == "all_gather":
        out = buffers.empty(dtype, count * P)
        inp = out[r * count:(r + 1) * count] if inplace else x
        if inplace:
            buffers.assign(inp, x)
        comm.all_gather(out, inp, algorithm=algo)
    elif collective == "all_to_all":
        out = x if inplace else buffers.empty(dtype, count * P)
        comm.all_to_all(out, x, algorithm=algo)
    elif collective == "broadcast":
        out = x
        comm.broadcast(out, root=root, algorithm=algo)
    elif collective == "gather":
        out = buffers.empty(dtype, count * P) if r == root else None
        inp = out[r * count:(r + 1) * count] if (inplace and r == root) else x
        if inplace and r == root:
            buffers.assign(inp, x)
        comm.gather(out, inp, root=root, algorithm=algo)
    else:  # scatter
        out = buffers.empty(dtype, count)
        src = x if r == root else None
        if inplace and r == root:
            out = x[r * count:(r + 1) * count]
        comm.scatter(out, src, root=root, algorithm=algo)
    return (None if out is None else buffers.to_host(out, dtype)), want


def roots_for(collective, P):
    return sorted({0, P - 1, P // 2}) if collective in ("broadcast", "gather", "scatter") else [0]


def moving_values(collective, P, cell):
    """The (dtype, in place) values the full product runs in ``cell`` = (algorithm, count, root,
    item bytes)."""
    return [(d, inplace) for d in DTYPES if ITEM_BYTES[d] == cell[3] and cell[0] in algos_for(collective, d, P)
            for inplace in placements(collective, cell[1])]


@functools.lru_cache(maxsize=None)
def moving_selection(collective, P, thinned=False):
    """{(algorithm, count, root, item bytes): (dtype, in place) values}: every value at 3
    ranks, a pairwise covering selection elsewhere; the large count: every value at 3 ranks,
    elsewhere each (algorithm, root) once with every dtype, size and placement met
    (matrix_selection.py)."""
    cells = [(algo, count, root, size) for size in (1, 2, 4, 8) for count in counts_for(P, collective)
             for root in roots_for(collective, P) for algo in ["auto"] + algorithms_at(collective, P)]
    return selected(P, cells, functools.partial(moving_values, collective, P),
                    is_large=lambda cell: cell[1] >= LARGE, joint=(0, 2), thinned=thinned)


def check_moving(comm, collective, large_only=False, small_only=False):
    """all_gather / all_to_all / broadcast / gather / scatter: exact for every dtype (the dtype x
    placement values thinned to a pairwise covering away from 3 ranks: moving_selection)."""
    P, r = comm.size, comm.rank
    failures, digests = Failures(), []
    selection = moving_selection(collective, P, large_only)
    for dtype in DTYPES:
        for count in counts_for(P, collective):
            if (large_only and count < LARGE) or (small_only and count >= LARGE):
                continue
            for root in roots_for(collective, P):
                for algo in algos_for(collective, dtype, P):
                    for inplace in placements(collective, count):
                        if (dtype, inplace) not in selection[(algo, count, root, ITEM_BYTES[dtype])]:
                            continue
                        what = (f"{collective} {algo} {dtype} count={count} root={root} "
                                f"{'in-place' if inplace else 'out-of-place'} P={P} rank={r}")
                        try:
                            out, want = run_moving(comm, HostBuffers, collective, algo, dtype, count, root, inplace)
                        except Exception as e:  # noqa: BLE001
                            failures.append(f"{what}: raised {type(e).__name__}: {e}")
                            continue
                        if out is None:
                            continue
                        if report(failures, what, dtype, out, want, None, P) and collective in ("all_gather", "broadcast"):
                            digests.append((what.rsplit(" rank=", 1)[0], hashlib.sha1(raw(out)).hexdigest()))
    return failures.listed(), digests


def check_collective(comm, collective, large_only=False, small_only=False):
    """One collective's matrix on this rank. ``large_only``: just the ~1M-element count, in its
    each-choice covering at any world size (a rerun under a setting that only changes how large
    messages move: the small counts would repeat the default run's calls exactly). ``small_only``:
    every count but that one (a rerun under a setting that changes how small messages move)."""
    if collective in ("all_reduce", "reduce_scatter", "reduce"):
        return check_reducing(comm, collective, large_only, small_only)
    if collective == "barrier":
        return check_barrier(comm), []
    return check_moving(comm, collective, large_only, small_only)


def check_barrier(comm, rounds=20):
    """auto (on one host the shared-memory flags) and every named schedule, ``rounds`` each: no
    rank may leave a round before the last rank entered it (CLOCK_MONOTONIC is one clock for all
    the processes of a host; the stamps are taken outside the call, so a right barrier never fails).
    In round i rank i mod P enters 1 ms late, so a barrier that lets ranks through early shows."""
    algos = ["auto"] + list(commlib.algorithms("barrier"))
    stamps = np.zeros((len(algos), rounds, 2), np.int64)
    for a, algo in enumerate(algos):
        for i in range(rounds):
            if i % comm.size == comm.rank:
                time.sleep(0.001)
            stamps[a, i, 0] = time.monotonic_ns()
            comm.barrier(algorithm=algo)
            stamps[a, i, 1] = time.monotonic_ns()
    every = np.empty(comm.size * stamps.size, np.int64)
    comm.all_gather(every, stamps.ravel(), "ring")
    every = every.reshape(comm.size, len(algos), rounds, 2)
    last_in, first_out = every[..., 0].max(axis=0), every[..., 1].min(axis=0)
    return [f"barrier {algos[a]} round {i} on rank {comm.rank}: a rank left {last_in[a, i] - first_out[a, i]} ns "
            f"before the last one entered" for a, i in zip(*np.nonzero(first_out < last_in))][:MAX_RECORDED]


def check_p2p(comm):
    """Ring shifts with sendrecv and batches, every dtype, sizes 0, 1, 13 and BIG (~1M: every
    dtype at FULL_LARGE_AT ranks, one dtype of each element size elsewhere: bytes move alike
    whatever the dtype), then a send/recv chain."""
    P, r = comm.size, comm.rank
    failures = []
    if P == 1:
        return failures
    large_dtypes = DTYPES if P == FULL_LARGE_AT else ("int8", "bfloat16", "float32", "int64")
    for dtype in DTYPES:
        for count in (0, 1, 13, BIG) if dtype in large_dtypes else (0, 1, 13):
            x = HostBuffers.make(dtype, values(dtype, "sum", r, count, 2))
            out = HostBuffers.empty(dtype, count)
            comm.sendrecv(x, (r + 1) % P, out, (r - 1) % P)
            want = rounded(dtype, values(dtype, "sum", (r - 1) % P, count, 2))
            report(failures, f"sendrecv {dtype} count={count} rank={r}", dtype, HostBuffers.to_host(out, dtype),
                   want, None, P)
    # Plain send/recv in a chain 0 -> 1 -> ... (blocking, ordered).
    buf = np.zeros(1000, np.int64)
    if r == 0:
        buf[:] = np.arange(1000)
        comm.send(buf, 1)
    else:
        comm.recv(buf, r - 1)
        buf += 1
        if r + 1 < P:
            comm.send(buf, r + 1)
    if not np.array_equal(buf, np.arange(1000) + r):
        failures.append(f"chain send/recv on rank {r}: got {buf[:3]}")
    return failures


def check_async_order(comm):
    """Many async calls complete in order and give the same results as blocking ones."""
    P, r = comm.size, comm.rank
    xs = [np.full(1000 + k, r + k, np.int64) for k in range(20)]
    works = [comm.all_reduce(x, async_op=True, algorithm="ring" if k % 2 else "auto") for k, x in enumerate(xs)]
    for w in works:
        w.wait()
    assert all(w.is_completed() for w in works)
    bad = [k for k, x in enumerate(xs) if not (x == sum(q + k for q in range(P))).all()]
    return bad


def torch_tensors(comm):
    """torch CPU tensors (incl. bfloat16) in and out of place, and refusal of non-contiguous ones."""
    torch = _torch()
    P, r = comm.size, comm.rank
    x = torch.arange(10, dtype=torch.bfloat16) + r
    comm.all_reduce(x)
    ok = torch.equal(x, sum(torch.arange(10, dtype=torch.float32) + q for q in range(P)).to(torch.bfloat16))
    y = torch.empty(P * 3, dtype=torch.float64)
    comm.all_gather(y, torch.full((3,), float(r), dtype=torch.float64))
    ok &= torch.equal(y, torch.arange(P, dtype=torch.float64).repeat_interleave(3))
    try:
        comm.all_reduce(torch.zeros(4, 4).t())
        ok = False
    except ValueError as e:
        ok &= "tensor" in str(e) and "contiguous" in str(e)
    return bool(ok)


def many_small_on_two_cores(comm, n):
    """``n`` small all_reduces (max of rank + call index) with this rank pinned to the first two
    CPUs it may use, so every rank of the pool shares two cores whatever the machine; the affinity
    is restored after. Returns the calls whose result was wrong (the first three)."""
    import os
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(allowed)[:2])
    wrong = []
    try:
        x = np.empty(1, np.float32)
        for i in range(n):
            x[0] = comm.rank + i
            comm.all_reduce(x, op="max")
            if x[0] != comm.size - 1 + i:
                wrong.append(f"call {i}: {x[0]} on rank {comm.rank}")
    finally:
        os.sched_setaffinity(0, allowed)
    return wrong[:3]


def direct_reads_enabled(comm):
    """Whether this rank announced single-copy reads (COMMLIB_CMA=1 and the OS allows them)."""
    import os
    return os.environ.get("COMMLIB_CMA") == "1" and comm._core.enable_direct_reads()
