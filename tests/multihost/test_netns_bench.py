"""``commlib bench --hosts 2 --netns``: commlib, gloo and Open MPI each run across two network
namespaces over the same veth links; the header and the JSON say which links were used. A tiny
sweep (timings are never asserted); root only, skipped where namespaces cannot be made."""
import json
import os
import subprocess
import sys

import pytest

from commlib.bench import report
from commlib.bench.mpi_peer import available as mpi_available
from commlib.testing.netns import unavailable_reason

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _no_netns():
    return unavailable_reason() if os.geteuid() == 0 else "network namespaces need root"


@pytest.mark.timeout(180)
def test_bench_across_namespaces_with_every_peer(tmp_path):
    why = _no_netns()
    if why:
        pytest.skip(f"no network namespaces here: {why}")
    peers = "gloo,mpi" if mpi_available()[0] else "gloo"
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "COMMLIB_SOCKET_IFNAME"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, "-m", "commlib", "bench", "all_reduce", "--np", "3", "--hosts", "2",
                             "--netns", "--rate", "1gbit", "-b", "4K", "-e", "4K", "--algorithms", "ring,hierarchical",
                             "-n", "2", "-w", "1", "--passes", "1", "--mode", "out", "--peers", peers,
                             "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp_path), env=env)
    try:
        stdout, stderr = proc.communicate(timeout=170)
    finally:
        proc.kill()
    p = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert p.returncode == 0, f"exit {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
    data = json.loads(out.read_text())
    assert report.validate(data) == []
    links = "veth between 2 network namespaces, tbf 1gbit each way"
    assert data["config"]["links"] == links
    assert f"commlib all_reduce ranks=3 transport=shm+tcp links: {links};" in p.stdout
    assert data["backends"]["commlib"]["transport"] == "shm+tcp"
    want = {"commlib", *peers.split(",")}
    assert {r["backend"] for r in data["results"]} == want
    assert all(r["wrong"] == 0 for r in data["results"])
    for peer in peers.split(","):
        assert data["backends"][peer]["available"] is True and data["backends"][peer]["transport"] == "tcp"
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    assert not [ln for ln in left if ln.startswith(f"cl{proc.pid}n")], left  # Namespaces' prefix
