"""``commlib bench-torch`` runs end to end and reports every column (numbers are not checked:
performance is measured, never asserted)."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_bench_torch_reports_every_kind(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "commlib", "bench-torch", "--np", "1", "-b", "8", "-e", "8",
                        "--rounds", "1", "--calls", "3",
                        "--collectives", "reduce_scatter_tensor,barrier", "--json", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["missing"] == {}, res["missing"]
    from commlib.bench.torch_overhead import KINDS
    assert len(KINDS) == 7
    for coll in ("reduce_scatter_tensor", "barrier"):
        for k in KINDS:
            assert res["median_us"][f"{coll}:{k}:8"] > 0
    for heading in ("### reduce_scatter_tensor", "commlib − fake", "commlib − ideal"):
        assert heading in r.stdout


def test_bench_torch_refuses_unknown_collective():
    r = subprocess.run([sys.executable, "-m", "commlib", "bench-torch", "--collectives",
                        "all_reduce,bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--collectives: unknown 'bogus'" in r.stdout
