"""A laned schedule on the kernel path, counted on the emulated device (issue #39, csrc/kernels/
device_list.h): rail_ring's channels (on one host the ring and its reverse, 2 lanes) run as one
step a ring round, C concurrent exchanges between two grid barriers, as a one-channel ring's rounds
do: the grid barriers of a launch are the ring's (4 blocks x (the descriptor exchange + 2 (P - 1)
steps)), not C times its steps'; and the results are right. Run in the counting pool of
test_call_counts.py (its communicators make no device call themselves). Across hosts (2 x 2 ranks,
test_nccl.py's pool) the copy path runs every laned algorithm's device list: rail_ring's three
collectives, rail_split, and rail_window and rail_lanes with lanes (a pipeline segment of 8), the
collective matrix's checks (exact for integers, bitwise alike on every rank), and messages larger than
the emulated NCCL buffers (a merged step's exchanges one NCCL group)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
from call_count_cases import launch_counts  # noqa: E402
from device_cases import cc  # noqa: E402
from device_laned_cases import laned_matrix  # noqa: E402
from test_call_counts import COUNTING  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402
from test_nccl import TWO_HOSTS  # noqa: E402

from commlib import _C  # noqa: E402
from commlib.core.call_spec import COLLECTIVE  # noqa: E402


@pytest.mark.timeout(120)
def test_rail_ring_runs_one_step_a_round_on_the_kernel_path(pool):
    P, grid = 4, 4
    count = 8192  # 32 KiB of float32: chunks of the slot protocol, so the launch keeps its grid
    ring, rails = ("ring", count), ("rail_ring", count)
    for out in pool(P, env=DELAY_ENV, own=COUNTING).run(launch_counts, [ring, rails], timeout=100):
        assert all(right for _, right in out.values()), out
        per = {case: counts for case, (counts, _) in out.items()}
        assert per[ring]["message_blocks"] == per[rails]["message_blocks"] == grid, per
        assert per[ring]["grid_barriers"] == grid * (1 + 2 * (P - 1)), per[ring]
        # (list order: grid * (1 + 4 (P - 1)), 52)
        assert per[rails]["grid_barriers"] == per[ring]["grid_barriers"], per[rails]


SEGMENT = 8


def laned_cases():
    """(collective, algorithm, dtype, op, count, root, in place): the laned algorithms x awkward
    counts (0, 1, fewer than the ranks, a prime, more than 64 segments' worth), dtypes and ops
    rotating."""
    algos = [("all_reduce", a) for a in ("rail_ring", "rail_split", "rail_window", "rail_lanes")] + [
        ("all_gather", "rail_ring"), ("reduce_scatter", "rail_ring")]
    cases, k = [], 0
    for coll, algo in algos:
        for count in (0, 1, 3, 97, 1031):
            dtype = cc.DTYPES[k % len(cc.DTYPES)]
            ops = cc.INT_OPS if dtype in cc.INTS else cc.FLOAT_OPS
            op = ops[k % len(ops)] if coll in device_cases.REDUCING else "sum"
            cases.append((coll, algo, dtype, op, count, 0, k % 2 == 1))
            k += 1
    # Messages larger than the emulated NCCL's 4 x 64 KiB of buffering per pair (test_nccl.py's
    # big_cases): a merged step's exchanges across hosts complete only as one NCCL group.
    big = 1_000_003
    return cases + [("all_reduce", algo, "float32", "sum", big, 0, False)
                    for algo in ("rail_ring", "rail_split", "rail_window")]


@pytest.mark.timeout(200)
def test_laned_algorithms_across_hosts_on_the_copy_path(pool):
    hosts = [0, 0, 1, 1]
    # The shapes are laned (the same builders the engines' plan cache calls, with the segment).
    for algo, count in (("rail_window", 97), ("rail_lanes", 97), ("rail_split", 97), ("rail_ring", 1)):
        s = _C.schedule(COLLECTIVE["all_reduce"], algo, 0, 4, count, 0, _C.DType.float32, hosts, "", SEGMENT)
        assert s["lanes"] > 1 and _C.device_list(s, s["lanes"])["merged"] == (algo != "rail_lanes"), (algo, s["lanes"])
    device_cases.check_results(pool(4, env=TWO_HOSTS).run(laned_matrix, laned_cases(), SEGMENT, timeout=180))
