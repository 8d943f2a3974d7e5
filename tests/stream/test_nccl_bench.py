"""`commlib bench --device emulated --peers nccl`: the sweep runs on emulated device buffers with
results checked (-c 1), the NCCL peer is the emulated NCCL and says so, busbw follows nccl-tests'
factors, and the comparison table pairs our best with NCCL's row at every size."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(120)
def test_device_bench_on_emulated_with_the_nccl_peer(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "commlib", "bench", "all_reduce", "all_gather", "--device", "emulated", "--np", "3",
           "-b", "64", "-e", "64K", "-f", "32", "-n", "3", "-w", "1", "--passes", "1", "--rounds", "1",
           "--min-time", "0", "--algorithms", "ring,auto", "--paths", "auto", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": ROOT, "COMMLIB_EMULATED_DELAY_US": "0"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["config"]["device"] == "emulated" and data["config"]["peers"] == ["nccl"]
    assert "emulated NCCL" in data["backends"]["nccl"]["transport"]
    recs = data["results"]
    by = {(r["backend"], r["collective"], r["algorithm"], r["mode"], r["bytes"]): r for r in recs}
    sizes = sorted({r["bytes"] for r in recs if r["collective"] == "all_reduce"})
    assert sizes == [64, 2048, 65536], sizes
    for r in recs:
        assert r["wrong"] == 0, r  # checked against the reference on every rank
        assert r["world_size"] == 3 and r["time_us"]["median"] > 0
        factor = {"all_reduce": 2 * 2 / 3, "all_gather": 2 / 3}[r["collective"]]
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor, rel=1e-9)
    for coll in ("all_reduce", "all_gather"):
        mode = "in" if coll == "all_reduce" else "out"
        for b in sorted({r["bytes"] for r in recs if r["collective"] == coll}):
            assert ("nccl-emulated", coll, "nccl-emulated", mode, b) in by
            assert ("commlib", coll, "ring", mode, b) in by
    assert "ours/NCCL busbw" in p.stdout and "the peer is the emulated NCCL" in p.stdout, p.stdout[-2000:]
    assert "emulated device, link auto" in p.stdout
    assert "path auto (kernel at every size unless the tuning file's crossover says copy)" in p.stdout  # which path each size ran


def test_device_bench_refuses_host_peers_on_a_device():
    p = subprocess.run([sys.executable, "-m", "commlib", "bench", "--device", "emulated", "--peers", "gloo"],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "only nccl compares on the device" in p.stderr, p.stderr[-2000:]
