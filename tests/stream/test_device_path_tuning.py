"""The tuning file's device half obeyed on the emulated device (issue #25): the "device_path"
crossover moves auto's kernel/copy split per world size (the built-in default: no crossover), the
"kernel_path" rows pick the kernel path's algorithm, ranks whose crossovers differ are refused at
set-up naming COMMLIB_TUNING, and a small tune run (2 ranks, 2 sizes, 2 algorithms) writes rows
that auto then follows. The selection itself is tests/bench/test_device_tuning.py."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_path_tuning_cases import tune_on_the_device, with_table_of_rank  # noqa: E402
from kernel_call_check_cases import kernel_auto_choices  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

SCHEMA = "commlib-tuning/1"
KERNEL_ROWS = {"all_reduce": {"3": {"rows": [[-1, "ring"]]}}}


# kernel_auto_choices: all_reduce of 8 B, 64 KiB, 256 KiB and just over 1 MiB on 3 ranks, auto (buffers
# no peer can map, so the mapped two-shot is not auto's).
@pytest.mark.parametrize("crossover, paths", [
    ({"3": {"kernel_max_bytes": 65536}}, ["kernel", "kernel", "copy", "copy"]),
    ({"3": {"kernel_max_bytes": 1 << 20}}, ["kernel"] * 3 + ["copy"]),           # 1 MiB, the default until session 15
    ({"4": {"kernel_max_bytes": 0}}, ["kernel"] * 4),                            # another world size: no crossover
])
def test_auto_follows_the_tuning_files_crossover(pool, crossover, paths):
    table = {"schema": SCHEMA, "kernel_path": KERNEL_ROWS, "device_path": crossover}
    for before, after, policy, ran, ok, _ in pool(3, env=DELAY_ENV).run(
            kernel_auto_choices, {"COMMLIB_DEVICE_PATH": "auto"}, table, timeout=60):
        assert ok and before == after, (before, after)
        assert ran == paths, ran
        # the kernel path runs its measured rows; the copy path keeps the policy's choice
        assert after == [("ring" if p == "kernel" else pol) for p, pol in zip(paths, policy)], (after, policy)


def test_ranks_with_different_crossovers_are_refused(pool):
    tables = [{"schema": SCHEMA, "device_path": {"2": {"kernel_max_bytes": 65536}}}, {"schema": SCHEMA}]
    for msg in pool(2, env=DELAY_ENV).run(with_table_of_rank, tables, {"COMMLIB_DEVICE_PATH": "auto"}, timeout=40):
        assert msg.startswith("ValueError") and "COMMLIB_TUNING" in msg and "65536" in msg, msg
    # the forced paths never read it: the same tables agree there
    for msg in pool(2, env=DELAY_ENV).run(with_table_of_rank, tables, {"COMMLIB_DEVICE_PATH": "kernel"}, timeout=40):
        assert msg == "no error", msg


@pytest.mark.timeout(120)
def test_a_small_tune_run_writes_rows_that_auto_follows(pool):
    cfg = {"collectives": ["all_reduce"], "sizes": [4096, 65536], "dtype": "float32", "op": "sum", "root": 0,
           "iters": 3, "min_time": 0, "max_iters": 3, "warmup": 1, "check": True, "rounds": 1, "modes": ["in"],
           "algorithms": ["ring", "direct"], "peers": [], "device": "emulated", "paths": ["kernel", "copy"]}
    for table, resolved in pool(2, env=DELAY_ENV).run(tune_on_the_device, cfg, timeout=100):
        entry = table["kernel_path"]["all_reduce"]["2"]
        assert entry["source"] == "measured" and {a for _, a in entry["rows"]} <= {"ring", "direct"}, entry
        x = table["device_path"]["2"]["kernel_max_bytes"]
        for nbytes, (alg, path, ok) in zip(cfg["sizes"], resolved):
            assert ok, (resolved, table)
            assert path == ("kernel" if nbytes <= x else "copy"), (nbytes, x, path)
            if path == "kernel":
                want = next(a for mb, a in entry["rows"] if mb < 0 or nbytes <= mb)
                assert alg == want, (nbytes, alg, entry)
        assert "all_reduce" not in table["collectives"]  # device records make no host rows


def test_ranks_whose_kernel_path_rows_differ_hear_of_it_from_the_call(pool):
    # as for host rows (and overrides): the call's descriptor check names both ranks' calls
    tables = [{"schema": SCHEMA, "kernel_path": {"all_reduce": {"2": {"rows": [[-1, rows]]}}}}
              for rows in ("ring", "direct")]
    for msg in pool(2, env=DELAY_ENV).run(with_table_of_rank, tables, {"COMMLIB_DEVICE_PATH": "kernel"}, timeout=40):
        assert msg.startswith("MismatchError") and "rank 0" in msg and "rank 1" in msg, msg
