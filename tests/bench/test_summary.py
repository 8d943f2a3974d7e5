"""bench/results/summary.csv (bench/summary.py): the raw JSON runs stay out of git, so the summary
must give back everything the reports are made of."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "bench")]

import summary  # noqa: E402
import synth  # noqa: E402
from commlib.bench import report  # noqa: E402


def test_summary_round_trip_keeps_what_the_reports_use(tmp_path):
    runs = [("np4", synth.data(P=4)), ("np2", synth.data(P=2, mpi=False))]
    runs[0][1]["command"] = "commlib bench --np 4"
    path = str(tmp_path / "summary.csv")
    summary.write(path, runs, ["commlib tune <2 runs>", "commlib bench --np 4    # 3 s"])
    commands, back = summary.read(path)
    assert commands == ["commlib tune <2 runs>", "commlib bench --np 4    # 3 s"]
    assert [n for n, _ in back] == ["np4", "np2"]
    for (_, d), (_, e) in zip(runs, back):
        assert not report.validate(e), report.validate(e)
        assert e["machine"] == d["machine"] and e["memcpy"] == d["memcpy"] and e.get("command") == d.get("command")
        assert len(e["results"]) == len(d["results"])
        for r, s in zip(d["results"], e["results"]):
            for k in ("backend", "collective", "algorithm", "mode", "world_size", "dtype", "bytes", "count", "wrong"):
                assert s[k] == r[k], k
            assert s["time_us"]["median"] == r["time_us"]["median"]  # exact: digits must not flip
            assert s["time_us"]["loop_avg"] == r["time_us"]["loop_avg"]  # the throughput beside it
            assert s["cpu_us"] == r["cpu_us"]  # and what the call cost, whatever the load
    assert report.comparison(report.merged_records([d for _, d in back])) == \
        report.comparison(report.merged_records([d for _, d in runs]))


def test_summary_in_git_regenerates_the_results_markdown():
    path = os.path.join(ROOT, "bench", "results", "summary.csv")
    commands, runs = summary.read(path)
    assert commands and {d["world_size"] for _, d in runs} >= {2, 4, 8}
    assert all(r["time_us"]["median"] > 0 for _, d in runs for r in d["results"])


def test_results_script_installs_the_mpi_peer_or_stops(tmp_path, monkeypatch):
    """bench/results.py runs scripts/install_mpi.sh (as scripts/bench.sh does) when its runs compare
    with MPI, and stops before measuring anything where MPI cannot be had, unless --peers leaves it
    out (a venv rebuilt by setup.sh lost mpi4py and every MPI row said "not measured")."""
    import results
    failing = tmp_path / "install.sh"
    failing.write_text("exit 1\n")
    assert results.compared_peers([]) == ["gloo", "mpi"]
    assert results.compared_peers(["all_reduce", "--peers", "gloo"]) == ["gloo"]
    assert results.compared_peers(["--peers=none"]) == ["none"]
    assert results.ensure_mpi(["--peers", "gloo"], install=str(tmp_path / "absent.sh")) is None
    why = results.ensure_mpi([], install=str(failing))
    assert why and "exit 1" in why and "--peers" in why, why

    def no_runs(*a, **k):
        raise AssertionError("measured without the MPI peer")
    monkeypatch.setattr(results, "run_bench", no_runs)
    monkeypatch.setattr(results, "ensure_mpi", lambda extra: "no MPI here")
    assert results.main(["--np", "2", "--no-tune", "--out-dir", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()
