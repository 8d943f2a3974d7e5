"""The collective matrix on the emulated device, through the stream engine, with the stream delay
on (COMMLIB_EMULATED_DELAY_US) and every rank of a pool sharing emulated device 0.

The default runs each call on two streams (sends | receives, COMMLIB_DEVICE_STREAMS=2); one test
runs world size 3 on the caller's stream alone (=1).

A covering selection instead of the full product (which the host executor's matrix runs): at
every world size 1-5 and 8, every collective x algorithm (auto included) runs two of the counts
0, 1, size - 1, 13 and 97 (prime), rotating, and dtypes, ops, roots and in/out of place rotate
across the cases; one
sweep runs every dtype x op (all_reduce and reduce_scatter); one ~1M-element call per collective
at 3 ranks (uneven splits) and 4 (power of two: several doubling rounds; at 8, where it ran until
issue #36, the same power-of-two shapes cost twice the time on 2 cores).
Outputs every rank must hold identically are compared bitwise across ranks.
"""
import os
import sys

import pytest

import commlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
from device_cases import cc  # noqa: E402
from emulated_pools import DELAY_ENV  # noqa: E402,F401  (tests/: the shared pools; other modules import it from here)

SIZES = [1, 2, 3, 4, 5, 8]
COLLECTIVES = ["all_reduce", "reduce_scatter", "reduce", "all_gather", "all_to_all", "broadcast",
               "gather", "scatter"]
ROOTED = ("reduce", "broadcast", "gather", "scatter")


def _ops(dtype):
    return cc.INT_OPS if dtype in cc.INTS else cc.FLOAT_OPS


def covering_cases(P):
    """Every collective x algorithm x count at world size P; dtype, op, root and placement
    rotate so that each of them is met across the cases."""
    cases = []
    k = P
    counts = (0, 1, max(P - 1, 0), 13, 97)
    for coll in COLLECTIVES:
        for a, algo in enumerate(["auto"] + commlib.algorithms(coll)):
            # Two of the five counts per algorithm, rotating: every count meets every collective
            # at every world size, and every algorithm across the world sizes.
            for count in (counts[(a + P) % 5], counts[(a + P + 2) % 5]):
                dtype = cc.DTYPES[k % len(cc.DTYPES)]
                op = _ops(dtype)[k % len(_ops(dtype))] if coll in device_cases.REDUCING else "sum"
                root = (0, P - 1, P // 2)[k % 3] if coll in ROOTED else 0
                cases.append((coll, algo, dtype, op, count, root, k % 2 == 1))
                k += 1
    return cases


def dtype_op_sweep(P):
    """Every dtype x op, on all_reduce (ring) and reduce_scatter (auto), count 13."""
    return [(coll, algo, dtype, op, 13, 0, False)
            for coll, algo in (("all_reduce", "ring"), ("reduce_scatter", "auto"))
            for dtype in cc.DTYPES for op in _ops(dtype)]


def big_cases(P):
    """One ~1M-element call per collective (float32 sum, auto's choice)."""
    return [(coll, "auto", "float32", "sum", cc.big(coll, P), 0, False) for coll in COLLECTIVES]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", SIZES)
def test_collective_matrix_on_emulated_device(pool, size):
    cases = covering_cases(size)
    if size == 3:
        cases += dtype_op_sweep(size)
    if size in (3, 4):
        cases += big_cases(size)
    device_cases.check_results(pool(size, env=DELAY_ENV).run(device_cases.check_cases, cases, timeout=240))


@pytest.mark.timeout(300)
def test_single_stream_calls(pool):
    """COMMLIB_DEVICE_STREAMS=1 (every step on the caller's stream, no send/receive split): the
    world-size-3 covering cases and the big ones."""
    env = dict(DELAY_ENV, COMMLIB_DEVICE_STREAMS="1")
    device_cases.check_results(pool(3, env=env).run(device_cases.check_cases, covering_cases(3) + big_cases(3), timeout=240))
