"""A tiny real ``commlib bench`` run through the command line: every result checked (-c 1), JSON
valid, #wrong == 0, and a report made from it. Timings are never asserted."""
import json
import os
import subprocess
import sys

import pytest

from commlib.bench import report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(tmp_path, args, timeout=240):
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    p = subprocess.run([sys.executable, "-m", "commlib", "bench", *args, "--json", str(out)],
                       capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path), env=env)
    assert p.returncode == 0, f"exit {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
    data = json.loads(out.read_text())
    assert report.validate(data) == []
    return data, p.stdout


def test_tiny_sweep_all_correct(tmp_path):
    data, stdout = _bench(tmp_path, ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                     "--np", "2", "-b", "64", "-e", "4K", "-f", "64", "-n", "2", "-w", "1",
                                     "-c", "1", "--peers", "none"])
    recs = data["results"]
    assert recs and all(r["wrong"] == 0 for r in recs)
    assert {r["collective"] for r in recs} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                              "broadcast"}
    assert {r["bytes"] for r in recs if r["collective"] == "all_reduce"} == {64, 4096}
    assert all(r["world_size"] == 2 and r["backend"] == "commlib" for r in recs)
    # -n 2 is the minimum; microsecond calls get more (--min-time, capped by --max-iters), and the
    # series of a close verdict as many calls again a round in --close-rounds more rounds.
    assert all(2 <= r["iters"] <= 1000 * r["rounds"] / (r["rounds"] - r.get("close_rounds", 0)) for r in recs)
    assert max(r["iters"] for r in recs) > 2
    auto = [r for r in recs if r["algorithm"] == "auto"]
    assert auto and all(r["resolved"] != "auto" for r in auto)
    assert "# Avg bus bandwidth" in stdout and "out-of-place" in stdout
    assert data["machine"]["cpu"] and data["memcpy"]
    assert data["backends"]["mpi"]["available"] is False
    path = report.generate([data], str(tmp_path / "rep"))
    assert os.path.getsize(path) > 10000


def _netns_bench_runs():
    from commlib.testing.netns import unavailable_reason
    return os.geteuid() == 0 and not unavailable_reason()


@pytest.mark.skipif(_netns_bench_runs(), reason="tests/multihost/test_netns_bench.py runs the gloo peer through "
                    "the same command line here, across two network namespaces, with every check this makes")
def test_tiny_sweep_against_gloo(tmp_path):
    # --passes 1: each gloo job's ranks import torch (~20 s on 2 busy cores); merging passes is
    # covered by test_tiny_sweep_all_correct (the default 2 passes) and test_bench_units.
    data, _ = _bench(tmp_path, ["all_reduce", "--np", "2", "-b", "1K", "-e", "1K", "--algorithms", "ring,auto",
                                "-n", "2", "-w", "1", "--peers", "gloo", "--mode", "in", "--passes", "1"])
    by = {r["backend"] for r in data["results"]}
    assert by == {"commlib", "gloo"} and all(r["wrong"] == 0 for r in data["results"])


def _has_mpi():
    from commlib.bench.mpi_peer import available
    return available()[0]


@pytest.mark.skipif(not _has_mpi(), reason="mpi4py or mpirun not installed")
def test_tiny_sweep_against_mpi(tmp_path):
    data, _ = _bench(tmp_path, ["all_reduce", "all_to_all", "--np", "2", "-b", "1K", "-e", "1K",
                                "--algorithms", "auto", "-n", "2", "-w", "1", "--peers", "mpi",
                                "--passes", "1"])
    mpi = [r for r in data["results"] if r["backend"] == "mpi"]
    assert len(mpi) == 2 and all(r["wrong"] == 0 for r in mpi)
    assert data["backends"]["mpi"]["available"] is True
    # one host: MPI's calls ran in commlib's rank processes, one mpirun job (commlib/bench/same_job.py),
    # in each collective's comparison mode
    assert data["config"]["jobs"] == ["commlib+mpi"] and data["backends"]["mpi"]["same_job"] is True
    assert {(r["collective"], r["mode"]) for r in mpi} == {("all_reduce", "in"), ("all_to_all", "out")}
    assert {r["backend"] for r in data["results"]} == {"commlib", "mpi"}


def test_single_copy_sides_in_one_job(tmp_path):
    """--single-copy-ab: every algorithm through a sub-communicator with single-copy reads off and
    one per smallest message with them on, all checked; the sides that are on really read
    single-copy (their probe is on)."""
    data, _ = _bench(tmp_path, ["all_to_all", "--np", "2", "-b", "64K", "-e", "256K", "-f", "2", "--algorithms",
                                "direct,auto", "-n", "2", "-w", "1", "--peers", "none", "--passes", "1",
                                "--single-copy-ab", "--mode", "out"])
    got = {r["algorithm"] for r in data["results"]}
    # the channels, and single-copy from 16, 32 and 64 KiB messages (commlib tune picks among them)
    assert got == {f"{a}@cma{s}" for a in ("direct", "auto") for s in ("0", "16K", "32K", "1")}
    assert all(r["wrong"] == 0 for r in data["results"]) and data["config"]["single_copy"] == "both"
    sides = data["backends"]["commlib"]["single_copy_sides"]
    assert sides["1"] == sides["16K"] == sides["32K"] == "" and "COMMLIB_CMA=0" in sides["0"]
    # the report reads the variants as their algorithms where the cost model is asked
    assert os.path.getsize(report.generate([data], str(tmp_path / "rep"))) > 10000


def test_streaming_sides_in_separate_jobs(tmp_path):
    """--stream-ab: commlib's job once with streaming stores never and once always in every pass
    (stream_ab.py says why not one job), every record named by its side and checked."""
    data, _ = _bench(tmp_path, ["all_gather", "--np", "2", "-b", "64K", "-e", "256K", "-f", "4", "--algorithms",
                                "direct,auto", "-n", "2", "-w", "1", "--peers", "none", "--stream-ab", "--mode", "out"])
    assert {r["algorithm"] for r in data["results"]} == {f"{a}@nt{s}" for a in ("direct", "auto") for s in "01"}
    assert all(r["wrong"] == 0 for r in data["results"]) and len(data["results"]) == 8
    assert data["config"]["stream_ab"] is True and data["config"]["stream_in_force"] is None
    assert data["config"]["jobs"] == ["commlib@nt0", "commlib@nt1"] and data["config"]["passes"] == 2
    assert data["backends"]["commlib"]["stream_bytes"] in ("0", "1")  # each side's job ran with its setting
