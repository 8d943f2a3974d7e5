"""Rank-side checks of collectives on emulated device arrays, through the stream engine.

Inputs, references and tolerances are those of tests/host/collective_reference.py (its docstring
states the float bounds); here every buffer is a commlib.emulated array, uploaded on the stream,
and results are read back with .numpy() (which waits for the stream, as .cpu() does).
"""
from __future__ import annotations

import collections
import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "host"))

import collective_cases as cc  # noqa: E402

import commlib.emulated as emu  # noqa: E402

REDUCING = ("all_reduce", "reduce_scatter", "reduce")


# bfloat16 as NumPy uint16 bit patterns (collective_reference.BF16), the representation of the
# references too: commlib.emulated takes them with dtype="bfloat16".
BF16 = cc.BF16


# Whether the arrays to_device makes have a shareable handle: False as a VMM allocation without one
# or a cudaMallocAsync pool's, which the one-sided calls stage (test_one_sided_kernel.py's matrix).
SHAREABLE = True


def to_device(x):
    if isinstance(x, BF16):
        return emu.from_numpy(x.view(np.uint16), dtype="bfloat16", shareable=SHAREABLE)
    return emu.from_numpy(x, shareable=SHAREABLE)


def from_device(a, dtype):
    """Host copy of a device array in the representation of cc.make (bfloat16: BF16 bits)."""
    h = a.numpy()
    return h.view(BF16) if dtype == "bfloat16" else h


def empty(dtype, n):
    """A device array pre-filled with collective_cases' poison (NaN / 77), so unwritten
    elements show up as wrong."""
    return to_device(cc.empty(dtype, n))


class DeviceBuffers:
    """collective_cases' buffer factory for commlib.emulated arrays (uploaded on the stream; read
    back with .numpy(), which waits for it)."""

    @staticmethod
    def make(dtype, v):
        return to_device(cc.make(dtype, v))

    @staticmethod
    def empty(dtype, n):
        return empty(dtype, n)

    to_host = staticmethod(from_device)

    @staticmethod
    def assign(dst, src):
        dst.copy_(src)


def run_case(comm, case):
    """One collective call on device arrays (collective_cases' case functions); returns (failure
    or None, digest key, digest)."""
    coll, algo, dtype, op, count, root, inplace = case
    P, r = comm.size, comm.rank
    what = (f"{coll} {algo} {dtype} {op} count={count} root={root} "
            f"{'in-place' if inplace else 'out-of-place'} P={P}")
    if coll in REDUCING:
        got, want, mag = cc.run_reducing(comm, DeviceBuffers, coll, algo, dtype, op, count, root, inplace)
    else:
        got, want = cc.run_moving(comm, DeviceBuffers, coll, algo, dtype, count, root, inplace)
        mag = None
    if got is None:
        return None, None, None
    failures = []
    cc.report(failures, f"{what} rank={r}", dtype, got, want, mag, P)
    if failures:
        return failures[0], None, None
    if coll in ("all_reduce", "all_gather", "broadcast"):
        return None, what, hashlib.sha1(cc.raw(got)).hexdigest()
    return None, None, None


def check_cases(comm, cases):
    """Runs every case; returns (failures, [(case, digest)]) like collective_cases. A case that
    raises is recorded and the rank goes on with the next one (a rank that stopped early would
    leave its peers waiting out the collective's timeout), so the failures list the matrix's
    whole extent; check_results counts them and shows the first lines."""
    failures, digests = [], []
    for case in cases:
        try:
            fail, key, digest = run_case(comm, tuple(case))
        except Exception as e:  # noqa: BLE001 - report every case
            failures.append(f"{case} rank={comm.rank}: raised {type(e).__name__}: {e}")
            continue
        if fail:
            failures.append(fail)
        if key:
            digests.append((key, digest))
    return failures, digests


SHOWN = 20  # failure lines check_results prints (it always gives the full count)


def check_results(results):
    """Asserts (in the test process) that no rank reported a wrong result and that every case's
    digest is the same on every rank (bitwise identical results)."""
    failures = [f for fails, _ in results for f in fails]
    assert not failures, (f"{len(failures)} failure(s) (one per failing case per rank) over "
                          f"{len(results)} rank(s); the first "
                          f"{min(SHOWN, len(failures))}:\n" + "\n".join(failures[:SHOWN]))
    by_case = collections.defaultdict(set)
    for _, digests in results:
        for case, digest in digests:
            by_case[case].add(digest)
    differing = [case for case, ds in by_case.items() if len(ds) > 1]
    assert not differing, f"ranks differ bitwise in {len(differing)} case(s), e.g. {differing[:3]}"
