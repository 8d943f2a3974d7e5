"""`commlib bench --device emulated --paths kernel,copy,auto`: each path on its own sub-communicator
(algorithms named `<algorithm>@<path>`), every record names the path its calls ran on (auto: the
kernel up to 1 MiB per rank, copy above), the results are checked (-c 1), the device copy bandwidth
is measured, and the report puts the paths side by side, saying the emulated numbers say nothing
about a GPU."""
import json
import os
import subprocess
import sys

import pytest

from commlib.bench import device_paths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(120)
def test_the_bench_compares_the_paths(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "commlib", "bench", "all_reduce", "--device", "emulated", "--np", "2",
           "-b", "64", "-e", "2M", "-f", "32768", "-n", "2", "-w", "1", "--passes", "1", "--rounds", "1",
           "--min-time", "0", "--algorithms", "ring", "--mode", "in", "--peers", "none",
           "--paths", "kernel,copy,auto", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": ROOT, "COMMLIB_EMULATED_DELAY_US": "0"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    ran = {(r["algorithm"], r["bytes"]): r["path"] for r in data["results"]}
    assert ran == {("ring@kernel", 64): "kernel", ("ring@kernel", 2 << 20): "kernel",
                   ("ring@copy", 64): "copy", ("ring@copy", 2 << 20): "copy",
                   ("ring@auto", 64): "kernel", ("ring@auto", 2 << 20): "copy"}, ran
    assert all(r["wrong"] == 0 for r in data["results"])
    assert data["backends"]["commlib"]["device_copy_GBps"] > 0
    report = subprocess.run([sys.executable, "-m", "commlib.bench.device", str(out)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60).stdout
    assert "kernel µs" in report and "copy µs" in report and "auto ran" in report, report
    assert "say nothing about a GPU" in report, report


def test_path_rows_pair_the_paths_of_a_size():
    def rec(algo, path, us):
        return {"backend": "commlib", "collective": "all_reduce", "bytes": 8, "mode": "in", "algorithm": algo,
                "time_us": {"median": us}, "busbw_GBps": 0.5, "path": path}
    rows = device_paths.path_rows([rec("ring@kernel", "kernel", 10.0), rec("ring@copy", "copy", 30.0),
                                   rec("ring@auto", "kernel", 11.0), rec("ring", "kernel", 1.0)])
    assert len(rows) == 1 and rows[0]["algorithm"] == "ring"
    assert rows[0]["copy_over_kernel"] == pytest.approx(3.0) and rows[0]["auto"]["ran"] == "kernel"


def test_unknown_paths_are_refused():
    with pytest.raises(SystemExit, match="--paths"):
        device_paths.parse_paths("kernel,fast")
