"""One-sided plans on the kernel path (issue #38: csrc/kernels/plan_one_sided.cuh, the staged path
of csrc/stream/kernel_path_one_sided.cc) on the emulated device, whose blocks are host threads, with
the stream delay on (it perturbs every data item of every block) and every rank of a pool on
emulated device 0 (several ranks per device).

The matrix: the five mapped algorithms at world sizes 1-5 and 8, counts 0, 1, P-1, 13, 97 and
1500 (so several blocks, each with its own flags, and tails of every length), dtypes, ops and
placement (in place / out of place) rotating; results checked against the reference and bitwise
equal across ranks. Users' buffers are not registered yet, so every call takes the staged path
(the input copied into the rank's slots area, peers read it there). The pools are the copy path's
(test_device_collectives.py), the settings applied per sub-communicator.

The counters (item 5) pin, per algorithm at 4 ranks and 4 MiB, what a call costs: data bytes
read and written per rank / N, the staged copies apart, system-scope fences per block per
handshake, grid barriers, host-memory accesses while data moves."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
from device_cases import cc  # noqa: E402
from one_sided_cases import ONE_SIDED, counted_call, one_sided_matrix  # noqa: E402
from test_device_collectives import DELAY_ENV, _ops  # noqa: E402


def one_sided_cases(P):
    out, k = [], P
    for coll, algo in ONE_SIDED:
        for count in (0, 1, max(P - 1, 0), 13, 97, 1500):
            dtype = cc.DTYPES[k % len(cc.DTYPES)]
            op = _ops(dtype)[k % len(_ops(dtype))] if coll in device_cases.REDUCING else "sum"
            out.append((coll, algo, dtype, op, count, 0, coll != "all_to_all" and k % 2 == 1))
            k += 1
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_one_sided_matrix_on_the_kernel_path(pool, size):
    cases = one_sided_cases(size)
    results = pool(size, env=DELAY_ENV).run(one_sided_matrix, cases, timeout=240)
    device_cases.check_results([(f, d) for f, d, _, _ in results])
    for _, _, paths, counters in results:
        assert paths == ["kernel"], paths
        if size > 1:  # every call with peers ran one-sided launches, and their blocks moved the data
            assert counters["handshakes"] > 0 and counters["bytes_written"] > 0 and counters["staged_bytes"] > 0


N = 4 << 20  # bytes per rank of the counted calls (the ratios are exact at any multiple of P x 64 x blocks)


def per_n(c, key):
    return c[key] / N


# (collective, algorithm, count) -> what one call at P=4 costs per rank, per N bytes: data read,
# data written, the staged copies (loaded + stored), grid barriers per block.
P = 4
EXPECTED = {
    # two-shot: copy own block, P-1 get_reduce (both operands loaded), P-1 gets of the others'
    # blocks; staged in place (input in, output out: 4 N)
    ("all_reduce", "mapped_two_shot"): ((3 * P - 2) / P, (2 * P - 1) / P, 4.0, 2),
    # one-shot: P-1 gets into scratch, then the rank-order sum: P-1 reductions over N
    ("all_reduce", "mapped_one_shot"): ((P - 1) + 2 * (P - 1), (P - 1) + 1 + (P - 2) + 0.0, 2.0, 1),
    ("all_gather", "mapped"): (P, P, 2.0, 1),
    ("reduce_scatter", "mapped"): (1 + 2 * (P - 1), P, 2.0 * P, 1),
    ("all_to_all", "mapped"): (P, P, 2.0 * P, 1),
}


@pytest.mark.timeout(240)
def test_counters_per_algorithm(pool):
    calls = [(coll, algo, (N // 4) if coll in ("all_reduce",) else N // 4 // (P if coll == "reduce_scatter" else 1))
             for coll, algo in ONE_SIDED]
    got = {}
    for coll, algo, count in calls:
        res = pool(P, env=DELAY_ENV).run(counted_call, coll, algo, count, {"COMMLIB_DEVICE_SLOT_BYTES": str(8 << 20)},
                                         timeout=200)
        got[(coll, algo)] = res
    for (coll, algo), res in got.items():
        for c, ok in res:
            assert ok, (coll, algo)
            runs = c["block_runs"]
            assert c["host_data_accesses"] == 0, (coll, algo, c)  # nothing on the data path touches host memory
            # <= 2 system-scope fences per block per handshake: a release store to signal, an acquire fence to wait
            assert c["system_fences"] + c["handshakes"] <= 2 * c["handshakes"] + 0, (coll, algo, c)
            read, written, staged, barriers = EXPECTED[(coll, algo)]
            assert c["grid_barriers"] == barriers * runs, (coll, algo, c)
            if (coll, algo) == ("all_reduce", "mapped_two_shot"):
                assert per_n(c, "bytes_read") == read and per_n(c, "bytes_written") == written, c
                assert per_n(c, "staged_bytes") == staged, c
