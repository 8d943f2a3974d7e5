"""The local driver's passes and jobs (commlib/bench/local_driver.py): how a row's passes are merged
(--pass-statistic) and which jobs a pass runs (--peer-jobs: MPI in commlib's rank processes on one
host, commlib/bench/same_job.py)."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import synth  # noqa: E402


def _two_passes():
    a = synth.data(P=2, sizes=(8, 4096), collectives=("all_reduce",))["results"]
    b = json.loads(json.dumps(a))
    for i, r in enumerate(b):  # pass 2: every other row 3x faster, the rest 2x slower, one wrong
        r["time_us"]["median"] *= (1 / 3) if i % 2 else 2.0
    b[0]["wrong"] = 5
    return a, b


def test_merge_passes_keeps_each_rows_lowest_median_by_default():
    from commlib.bench.launcher import merge_passes
    a, b = _two_passes()
    assert merge_passes([a, b]) == merge_passes([a, b], "min")
    merged = merge_passes([a, b])
    assert len(merged) == len(a)
    for i, (r, ra, rb) in enumerate(zip(merged, a, b)):
        assert r["time_us"]["median"] == min(ra["time_us"]["median"], rb["time_us"]["median"])
        assert r["pass_medians_us"] == [ra["time_us"]["median"], rb["time_us"]["median"]]
    assert merged[0]["wrong"] == 5 and merged[1]["wrong"] == 0
    assert merge_passes([a]) == a  # one pass: unchanged
    # each pass's wall clock is kept beside its median (bench/spells.py --levels lines them up)
    for i, (ra, rb) in enumerate(zip(a, b)):
        ra["at"], rb["at"] = [10.0 + i, 11.0 + i], [20.0 + i, 21.0 + i]
    assert [r["pass_at"] for r in merge_passes([a, b])] == [[[10.0 + i, 11.0 + i], [20.0 + i, 21.0 + i]]
                                                            for i in range(len(a))]


def test_merge_passes_takes_the_median_of_the_passes_when_asked():
    from commlib.bench.launcher import merge_passes
    from commlib.perf import common as C
    a, b = _two_passes()
    c = json.loads(json.dumps(a))
    for r in c:
        r["time_us"]["median"] *= 1.5
    for passes in ([a, b], [a, b, c]):
        merged = merge_passes(passes, "median")
        for i, r in enumerate(merged):
            meds = [p[i]["time_us"]["median"] for p in passes]
            assert r["time_us"]["median"] == pytest.approx(float(np.median(meds)))
            assert r["pass_medians_us"] == meds and r["pass_statistic"] == "median"
            # the bandwidths follow the row's time
            assert r["busbw_GBps"] == pytest.approx(C.bandwidths(r["collective"], r["bytes"], r["world_size"],
                                                                 r["time_us"]["median"] * 1e-6)[1])
    with pytest.raises(ValueError, match="pass statistic"):
        merge_passes([a, b], "mean")


def test_mpi_on_one_host_runs_in_commlibs_job_unless_asked_not_to():
    from commlib.bench.hosts import Placement
    from commlib.bench.local_driver import job_order
    one, two = Placement(4, 1), Placement(4, 2)
    cfg = {"peers": ["gloo", "mpi"]}
    assert job_order(cfg, one, mpi_ok=True) == ["commlib+mpi", "gloo"]
    assert job_order(dict(cfg, peer_jobs="separate"), one, mpi_ok=True) == ["commlib", "gloo", "mpi"]
    assert job_order(cfg, one, mpi_ok=False) == ["commlib", "gloo", "mpi"]  # the MPI job then says why
    assert job_order(cfg, two, mpi_ok=True) == ["commlib", "gloo", "mpi"]  # across hosts: its own TCP job
    assert job_order({"peers": ["gloo"]}, one, mpi_ok=True) == ["commlib", "gloo"]


def test_a_failed_commlib_and_mpi_job_loses_mpis_column_never_commlibs(monkeypatch):
    """MPI found but its job writes nothing (mpirun or MPI's set-up failed): commlib runs alone, in
    that pass and the next, and only MPI's column is reported missing, with the reason."""
    from types import SimpleNamespace

    from commlib.bench import local_driver, mpi_peer, same_job
    from commlib.bench.hosts import Placement
    launched = []

    def fake_mpi(cfg_path, part, timeout, place, backend="mpi"):
        launched.append(backend)
        return False, "mpirun: could not start"

    def fake_local(name, cfg_path, part, timeout, place):
        launched.append(name)
        with open(part, "w") as f:
            json.dump({"records": [{"backend": name, "pass": cfg_path}], "info": {"available": True}}, f)
        return True, ""

    seen = {}

    def fake_finish(a, cfg, command, results, backends, status):
        seen.update(results=results, backends=backends, status=status, jobs=cfg["jobs"])
        return status

    monkeypatch.setattr(local_driver, "_launch_mpi", fake_mpi)
    monkeypatch.setattr(local_driver, "_launch_local", fake_local)
    monkeypatch.setattr(local_driver, "finish", fake_finish)
    monkeypatch.setattr(local_driver, "merge_passes", lambda per_pass, statistic: [r for p in per_pass for r in p])
    monkeypatch.setattr(mpi_peer, "available", lambda: (True, "mpirun"))
    cfg = {"peers": ["gloo", "mpi"], "sizes": [8], "collectives": ["all_reduce"]}
    assert local_driver.run_local(SimpleNamespace(passes=2, timeout=10), cfg, "bench", Placement(2, 1)) == 0
    assert launched == [same_job.INLINE, "commlib", "gloo", "gloo", "commlib"], launched
    assert [r["backend"] for r in seen["results"]] == ["commlib", "gloo", "gloo", "commlib"]
    assert seen["backends"]["mpi"]["available"] is False
    assert "could not start" in seen["backends"]["mpi"]["reason"], seen["backends"]["mpi"]
    assert seen["backends"]["commlib"]["available"] and seen["status"] == 0
    assert seen["jobs"] == ["commlib", "gloo"]
