"""COMMLIB_DEVICE_TRACE (issue #38 item 6: kernels/plan_trace.cuh, stream/kernel_path_trace.cc,
commlib/bench/device_trace.py) on the emulated device, 3 ranks with the stream delay on (the pool
of test_one_sided_kernel.py): a traced call has one record per (block, step) of its launch, in
that order, each step starting where the block's previous one ended, stamps non-decreasing, for a
one-sided plan and a message plan (whose steps end before their grid barriers); the records written as a
Chrome trace read back equal; and with the setting off the kernel stores nothing for the trace (its
counter pins it) and there are no records."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_device_collectives import DELAY_ENV  # noqa: E402
from trace_cases import ALGOS, traced_calls  # noqa: E402

from commlib.bench.device_trace import read_trace, step_table, write_trace  # noqa: E402


@pytest.mark.timeout(120)
def test_a_traced_call_has_a_record_per_block_and_step_and_an_untraced_one_stores_nothing(pool, tmp_path):
    p = pool(3, env=DELAY_ENV)
    traced = p.run(traced_calls, True, timeout=90)
    every = []
    for rank, per_algo in enumerate(traced):
        for algo in ALGOS:  # a one-sided plan (plan_one_sided.cuh) and a message plan (plan_kernel.cuh)
            records, stores, blocks, steps, ok = per_algo[algo]
            assert ok, (rank, algo)
            assert steps >= 1 and blocks >= 1, (rank, algo, steps, blocks)
            # block-major, then step order: every (block, step) of the launch exactly once
            assert [(r["block"], r["step"]) for r in records] == [(b, k) for b in range(blocks) for k in range(steps)], \
                (rank, algo, blocks, steps, records)
            for b in range(blocks):
                row = records[b * steps:(b + 1) * steps]
                assert all(r["rank"] == rank and r["start_ns"] <= r["end_ns"] for r in row), row
                assert all(row[k]["end_ns"] == row[k + 1]["start_ns"] for k in range(steps - 1)), row
            # per block: its start stamp and header, a stamp per step, the final header; nothing else
            assert stores == blocks * (steps + 3), (rank, algo, stores, blocks, steps)
            if algo == ALGOS[0]:
                every += records
    path = tmp_path / "trace.json"
    write_trace(every, str(path))
    assert read_trace(str(path)) == sorted(every, key=lambda r: (r["rank"], r["block"], r["step"]))
    assert "| 0 |" in step_table(every)
    for rank, per_algo in enumerate(p.run(traced_calls, False, timeout=90)):
        for algo in ALGOS:
            records, stores, _, _, ok = per_algo[algo]
            assert ok and records == [] and stores == 0, (rank, algo, records, stores)
