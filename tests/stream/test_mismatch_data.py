"""Device calls whose ranks disagree on the dtype or the count (issue #35, item 2), on both device
paths: no output ever holds a peer's bytes (the copy path's data steps skip once the call's
descriptor check failed: docs/gpu.md "A mismatched call writes nothing"; the kernel path's check
gates its own steps), and the MismatchError reaches the caller at the work's wait(), or at close()
when no later call surfaced it. Rank side in mismatch_data_cases.py."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mismatch_data_cases import mismatched_calls  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

CASES = [("all_reduce", "dtype", "blocking"), ("all_reduce", "count", "async"), ("all_gather", "dtype", "async"),
         ("reduce_scatter", "count", "blocking"), ("broadcast", "dtype", "blocking"), ("p2p", "count", "blocking"),
         ("p2p", "dtype", "async"), ("avg", "count", "blocking"), ("avg", "count", "async")]
# The kernel path alone: a one-sided call (refused by name on the copy path).
KERNEL_CASES = [("mapped", "count", "blocking"), ("mapped", "dtype", "async"), ("mapped_avg", "count", "async")]


def _check(results, cases, receivers_only=("p2p",)):
    wrong = []
    for rank, per_case in enumerate(results):
        for (coll, kind, mode), (unchanged, at_wait, at_close) in zip(cases, per_case):
            case = f"rank {rank}, {coll} ({kind}, {mode})"
            if not unchanged:
                wrong.append(f"{case}: an output changed")
            if coll in receivers_only and rank != 0:
                continue  # the sender of a message checks nothing (the receiver does)
            if at_wait is not None and at_close is not None:
                wrong.append(f"{case}: close() raised {at_close} after the call or wait() had raised")
            if mode == "async" and not (at_wait or "").startswith("MismatchError"):
                wrong.append(f"{case}: wait() raised {at_wait}")
            if mode == "blocking" and not (at_wait or at_close or "").startswith("MismatchError"):
                wrong.append(f"{case}: close() raised {at_close}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", ["kernel", "copy", "copy+gated"])
def test_a_mismatched_call_writes_nothing_and_raises(pool, path):
    cases = CASES + (KERNEL_CASES if path == "kernel" else [])
    _check(pool(2, env=DELAY_ENV).run(mismatched_calls, path, cases, timeout=200), cases)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["kernel", "copy"])
def test_a_rank_apart_from_the_mismatched_one_writes_nothing(pool, path):
    # A ring of 4 where rank 2 differs: rank 0's neighbours (1 and 3) call as it does, so only a
    # check against every rank (copy path) or the neighbours' own stop (kernel path) keeps rank 2's
    # bytes, or stale ones, out of rank 0's output. And a small direct all_gather (1 KiB blocks: one
    # block, its check folded into its data handshakes on the kernel path): rank 0 receives rank 1's
    # block before rank 2's, so only comparing every rank's descriptor before the first write to its
    # output keeps rank 1's bytes out of it (csrc/kernels/plan_call_check.cuh).
    cases = [("all_reduce", "dtype", "blocking"), ("all_gather", "dtype", "blocking")]
    _check(pool(4, env=DELAY_ENV).run(mismatched_calls, path, cases, 2, timeout=100), cases)
