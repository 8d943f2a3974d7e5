"""``commlib bench-torch`` runs end to end and reports every column (numbers are not checked:
performance is measured, never asserted)."""
import errno
import json
import socket
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


def test_bench_torch_holds_its_rendezvous_port_from_the_start():
    """The port the ranks meet on is bound by the server itself when it is picked, never picked
    free and bound later (a race with any other process taking it: EADDRINUSE under load)."""
    from commlib.bench.torch_overhead import serve_rendezvous_store
    store, port = serve_rendezvous_store()
    try:
        with socket.socket() as other:  # the port is taken at once: nobody else can bind it
            with pytest.raises(OSError) as e:
                other.bind(("127.0.0.1", port))
            assert e.value.errno == errno.EADDRINUSE
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # and served
    finally:
        del store
