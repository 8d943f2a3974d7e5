"""commlib.bench.stream_tuning and stream_ab: the tuning file's "stream" section (from which call size a
collective's copies use streaming stores, csrc/policy/stream_stores.h) from `commlib bench --stream-ab`
runs, the side each main-job record ran on, the rows taken from the side the entry gives each size,
and the local run's job per side."""
import json
from types import SimpleNamespace

import pytest

from commlib.bench import stream_ab, stream_tuning, tuning
from commlib.perf.common import core_bytes

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20
SIZES = (8, 65536, 2 * MiB, 8 * MiB)


def record(algorithm, nbytes, us, collective="all_gather", mode="out", run=0, side=None):
    r = {"backend": "commlib", "collective": collective, "world_size": 4, "bytes": nbytes, "dtype": "float32",
         "algorithm": algorithm if side is None else stream_ab.variant(algorithm, side), "mode": mode,
         "time_us": {"median": us}, "run": run}
    return r


def ab_run(ratio, run=0, collective="all_gather"):
    """One --stream-ab run's records: ring and direct on both sides at every size, in both modes; the
    streaming side's usual-mode times ``ratio(bytes)`` times the other's, its other mode's 0.5x (which
    must not count: the rows and the entry serve the usual call's mode)."""
    usual = "out" if collective == "all_gather" else "in"
    other = "in" if usual == "out" else "out"
    recs = []
    for b in SIZES:
        for algo, base in (("direct", 100.0 + b / 1e4), ("ring", 120.0 + b / 1e4)):
            recs += [record(algo, b, base, collective, usual, run, "0"),
                     record(algo, b, base * ratio(b), collective, usual, run, "1"),
                     record(algo, b, base, collective, other, run, "0"),
                     record(algo, b, base * 0.5, collective, other, run, "1")]
    return stream_ab.split_records(recs)


def test_the_names_of_a_side():
    assert stream_ab.parse("ring@nt1") == ("ring", "1")
    assert stream_ab.parse("ring@nt2") == ("ring@nt2", None)
    assert stream_ab.parse("ring@cma1") == ("ring@cma1", None)
    assert stream_ab.parse_job("commlib+mpi@nt0") == ("commlib+mpi", "0")
    assert stream_ab.parse_job("gloo") == ("gloo", None)
    assert stream_ab.job_env("1") == {"COMMLIB_STREAM_BYTES": "1"} and stream_ab.job_env(None) == {}
    recs = [{"backend": "commlib", "algorithm": "ring"}, {"backend": "mpi", "algorithm": "mpi"}]
    assert [r["algorithm"] for r in stream_ab.named_side(recs, "0")] == ["ring@nt0", "mpi"]
    assert stream_ab.named_side(recs, None) is recs
    assert stream_ab.named_side(recs, "1", {"stream_bytes": "1"})[0]["algorithm"] == "ring@nt1"
    with pytest.raises(RuntimeError, match="side 1 ran with COMMLIB_STREAM_BYTES=None"):
        stream_ab.named_side(recs, "1", {"stream_bytes": None})
    split = stream_ab.split_records([{"algorithm": "ring@nt1"}, {"algorithm": "mpi"}])
    assert split == [{"algorithm": "ring", "stream_stores": "1"}, {"algorithm": "mpi"}]


def test_streaming_from_the_size_it_wins_at_and_above():
    # loses at 8 B (noise), wins from 64 KiB on: the entry is 64 KiB of auto's bytes (per-rank input)
    recs = ab_run(lambda b: 1.02 if b == 8 else 0.8)
    assert stream_tuning.starts(recs) == {("all_gather", 4): core_bytes("all_gather", 65536, "float32", 4)}


def test_streaming_must_win_by_the_margin():
    # 2% ahead at 8 MiB: within STREAM_MARGIN, plain stores keep it; 4% ahead: streaming from 8 MiB
    assert stream_tuning.starts(ab_run(lambda b: 0.98)) == {("all_gather", 4): stream_tuning.NEVER}
    assert stream_tuning.starts(ab_run(lambda b: 0.96 if b == 8 * MiB else 0.98)) == {
        ("all_gather", 4): core_bytes("all_gather", 8 * MiB, "float32", 4)}


def test_a_loss_at_the_largest_size_is_never():
    recs = ab_run(lambda b: 0.7 if b < 8 * MiB else 1.3)  # other mode's 0.5x does not count
    assert stream_tuning.starts(recs) == {("all_gather", 4): stream_tuning.NEVER}
    assert stream_tuning.choose(recs)[1] == {"all_gather": {"4": {"min_bytes": -1}}}


def test_the_runs_are_compared_run_by_run_then_averaged():
    # run 0: streaming 1.3x slower at 8 MiB; runs 1 and 2: 0.8x; geometric mean 0.94: streaming at 8 MiB
    recs = ab_run(lambda b: 1.3 if b == 8 * MiB else 1.1, run=0)
    for run in (1, 2):
        recs += ab_run(lambda b: 0.8 if b == 8 * MiB else 1.1, run=run)
    ratios = stream_tuning.ratios(recs)[("all_gather", 4)]
    assert ratios[core_bytes("all_gather", 8 * MiB, "float32", 4)] == pytest.approx((1.3 * 0.8 * 0.8) ** (1 / 3))
    assert stream_tuning.starts(recs)[("all_gather", 4)] == core_bytes("all_gather", 8 * MiB, "float32", 4)


def test_the_side_a_main_job_record_ran_on():
    big, small = record("ring", 8 * MiB, 1.0), record("ring", 2 * MiB, 1.0)
    # no entry: the 32 MiB footprint rule (all_gather 8 MiB on 4 ranks: 32 MiB of outputs)
    assert stream_tuning.side_ran(big, {}) == "1" and stream_tuning.side_ran(small, {}) == "0"
    rs = dict(big, collective="reduce_scatter")  # its outputs: one block per rank, 8 MiB in all
    assert stream_tuning.side_ran(rs, {}) == "0"
    assert stream_tuning.side_ran(big, {"all_gather": {"4": {"min_bytes": -1}}}) == "0"
    assert stream_tuning.side_ran(small, {"all_gather": {"4": {"min_bytes": 0}}}) == "1"
    assert stream_tuning.side_ran(big, {"all_gather": {"8": {"min_bytes": -1}}}) == "1"  # another P's entry
    assert stream_tuning.side_ran(big, None) is None  # COMMLIB_STREAM_BYTES set: unknown


def test_the_rows_come_from_the_side_the_entry_gives_each_size():
    # streaming never wins; the main job's 8 MiB records ran streaming (the 32 MiB rule) and go, its
    # 2 MiB ones stay beside the A/B run's never-streaming side
    recs = ab_run(lambda b: 1.3)
    main = [dict(record("direct", b, 1.0), stream_ran=stream_tuning.side_ran(record("direct", b, 1.0), {}))
            for b in (2 * MiB, 8 * MiB)]
    picked, section = stream_tuning.choose(recs + main)
    assert section == {"all_gather": {"4": {"min_bytes": -1}}}
    assert all(r.get("stream_stores", "0") == "0" for r in picked)
    assert [r["bytes"] for r in picked if "stream_ran" in r] == [2 * MiB]


def test_without_ab_runs_the_previous_section_stays():
    recs = [record("ring", 8 * MiB, 1.0)]
    previous = {"stream": {"all_to_all": {"4": {"min_bytes": 1024}}}}
    assert stream_tuning.choose(recs, previous) == (recs, previous["stream"])
    # and a new entry joins the kept ones
    picked, section = stream_tuning.choose(ab_run(lambda b: 1.3), previous)
    assert section == {"all_to_all": {"4": {"min_bytes": 1024}}, "all_gather": {"4": {"min_bytes": -1}}}


def test_commlib_tune_writes_the_section_and_its_provenance(tmp_path):
    run = {"command": "commlib bench --stream-ab", "config": {"stream_ab": True, "single_copy": "auto"},
           "results": [dict(r, algorithm=stream_ab.variant(r["algorithm"], r.pop("stream_stores")))
                       for r in ab_run(lambda b: 1.3)], "world_size": 4}
    table = tuning.from_runs([run])
    assert table["stream"] == {"all_gather": {"4": {"min_bytes": -1}}}
    assert tuning.provenance([run], table)["stream"] == "measured by these runs"
    rows = table["collectives"]["all_gather"]["4"]["rows"]
    assert {a for _, a in rows} == {"direct"}, rows  # the never-streaming side's best
    main = {"command": "commlib bench", "config": {"single_copy": "auto"}, "world_size": 4,
            "results": [record("direct", 8 * MiB, 1.0)]}
    kept = tuning.from_runs([main], previous=table)
    assert kept["stream"] == table["stream"]
    assert tuning.provenance([main], kept)["stream"].startswith("kept from the previous file")


def test_the_local_run_starts_commlibs_job_once_per_side(monkeypatch):
    from commlib.bench import local_driver, mpi_peer
    from commlib.bench.hosts import Placement
    launched = []

    def fake_mpi(cfg_path, part, timeout, place, backend="mpi"):
        import os
        launched.append((backend, os.environ.get("COMMLIB_STREAM_BYTES")))
        with open(part, "w") as f:
            json.dump({"records": [{"backend": "commlib", "algorithm": "ring"}, {"backend": "mpi", "algorithm": "mpi"}],
                       "parts": {}, "info": {"available": True, "stream_bytes": os.environ.get("COMMLIB_STREAM_BYTES")}}, f)
        return True, ""

    def fake_local(name, cfg_path, part, timeout, place):
        import os
        launched.append((name, os.environ.get("COMMLIB_STREAM_BYTES")))
        with open(part, "w") as f:
            json.dump({"records": [{"backend": name, "algorithm": name}], "info": {"available": True}}, f)
        return True, ""

    seen = {}
    monkeypatch.delenv("COMMLIB_STREAM_BYTES", raising=False)
    monkeypatch.setattr(local_driver, "_launch_mpi", fake_mpi)
    monkeypatch.setattr(local_driver, "_launch_local", fake_local)
    monkeypatch.setattr(local_driver, "finish", lambda a, cfg, command, results, backends, status:
                        seen.update(results=results, jobs=cfg["jobs"]) or status)
    monkeypatch.setattr(local_driver, "merge_passes", lambda per_pass, statistic: [r for p in per_pass for r in p])
    monkeypatch.setattr(mpi_peer, "available", lambda: (True, "mpirun"))
    from commlib.bench import same_job
    monkeypatch.setattr(same_job, "split_parts", lambda got: (got["records"], {"commlib": got["info"]}))
    cfg = {"peers": ["gloo", "mpi"], "sizes": [8], "collectives": ["all_reduce"], "stream_ab": True}
    assert local_driver.run_local(SimpleNamespace(passes=2, timeout=10), cfg, "bench", Placement(2, 1)) == 0
    assert seen["jobs"] == ["commlib+mpi@nt0", "commlib+mpi@nt1", "gloo"]
    assert launched == [("commlib+mpi", "0"), ("commlib+mpi", "1"), ("gloo", None),
                        ("gloo", None), ("commlib+mpi", "1"), ("commlib+mpi", "0")], launched
    algos = [r["algorithm"] for r in seen["results"]]
    assert algos[:5] == ["ring@nt0", "mpi", "ring@nt1", "mpi", "gloo"], algos
