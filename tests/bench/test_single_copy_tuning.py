"""`commlib tune` from runs with single-copy reads on (COMMLIB_CMA=1) and off: the tuning file's
"single_copy" crossover per collective and world size, the algorithm rows taken from the side each
size will run on, and the crossover installed into the core (csrc/policy/single_copy.h)."""
import copy
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import synth  # noqa: E402
import commlib._C as _C  # noqa: E402
from commlib.bench import tuning  # noqa: E402
from commlib.core.call_spec import COLLECTIVE  # noqa: E402
from commlib.perf import common as C  # noqa: E402

SIZES = (8, 4096, 1 << 20, 16 << 20)


def _runs():
    """An off run, and an on run where single-copy is 2x slower below 1 MiB (bruck 100x) and, from
    1 MiB, makes bruck all_to_all 3x faster than the off run's best: the rows must follow the off
    run below the crossover and the on run above it."""
    off = synth.data(P=4, sizes=SIZES, collectives=("all_to_all",))
    on = copy.deepcopy(off)
    best_off = {}
    for r in off["results"]:
        if r["backend"] == "commlib" and r["algorithm"] != "auto":
            best_off[r["bytes"]] = min(best_off.get(r["bytes"], 1e9), r["time_us"]["median"])
    for r in on["results"]:
        if r["backend"] != "commlib":
            continue
        if r["bytes"] < (1 << 20):  # slower, bruck (the off run's pick at 8 B) far slower
            r["time_us"]["median"] *= 100 if r["algorithm"] == "bruck" else 2
        elif r["algorithm"] == "bruck":
            r["time_us"]["median"] = best_off[r["bytes"]] / 3
    off["config"]["single_copy"], on["config"]["single_copy"] = "0", "1"
    return off, on


def _write_runs(tmp_path):
    """The two runs (COMMLIB_CMA=0 and =1) written as bench JSON files; their paths."""
    paths = []
    for i, d in enumerate(_runs()):
        paths.append(str(tmp_path / f"run{i}.json"))
        with open(paths[-1], "w") as f:
            json.dump(d, f)
    return paths


def test_tune_writes_the_measured_crossover_and_takes_rows_from_its_side(tmp_path):
    from commlib import cli
    paths = _write_runs(tmp_path)
    out = str(tmp_path / "tuning.json")
    assert cli.main(["tune", *paths, "-o", out]) == 0
    table = tuning.read(out)
    one_mib = C.core_bytes("all_to_all", C.geometry("all_to_all", 1 << 20, "float32", 4)[2], "float32", 4)
    assert table["single_copy"] == {"all_to_all": {"4": {"min_bytes": one_mib}}}
    big = C.core_bytes("all_to_all", C.geometry("all_to_all", 16 << 20, "float32", 4)[2], "float32", 4)
    assert tuning.choose(table, "all_to_all", big, 4) == "bruck"
    off_only = tuning.from_results(_runs()[0]["results"])
    assert tuning.choose(off_only, "all_to_all", 8, 4) == "bruck"
    assert tuning.choose(table, "all_to_all", 8, 4) == "bruck"


def test_single_copy_never_wins_gives_never():
    off, on = _runs()
    for r in on["results"]:
        r["time_us"]["median"] = 10 * max(r["time_us"]["median"], 1.0)
    records = [dict(r, single_copy=d["config"]["single_copy"]) for d in (off, on) for r in d["results"]]
    assert tuning.from_results(records)["single_copy"] == {"all_to_all": {"4": {"min_bytes": -1}}}


def test_crossover_installs_into_the_core(monkeypatch):
    monkeypatch.setenv("COMMLIB_CMA", "auto")
    coll = COLLECTIVE["all_to_all"]
    try:
        tuning.install({"single_copy": {"all_to_all": {"4": {"min_bytes": 1 << 20}}}})
        assert _C.single_copy_min_message(coll, 1 << 20, 4) == 64 << 10
        assert _C.single_copy_min_message(coll, (1 << 20) - 1, 4) == -1
        assert _C.single_copy_min_message(coll, 1 << 30, 3) == -1  # no entry for 3 ranks
        monkeypatch.setenv("COMMLIB_CMA", "0")
        assert _C.single_copy_min_message(coll, 1 << 30, 4) == -1
        monkeypatch.setenv("COMMLIB_CMA", "1M")
        assert _C.single_copy_min_message(coll, 8, 4) == 1 << 20
    finally:
        _C.clear_tuning()
        tuning.load_default()


def _one_job_of_both_sides():
    """The two runs of _runs() as one --single-copy-ab run: each algorithm twice, <algorithm>@cma0
    and <algorithm>@cma1, in one job (commlib/bench/single_copy_ab.py)."""
    off, on = _runs()
    both = copy.deepcopy(off)
    both["config"]["single_copy"] = "both"
    both["results"] = []
    for d, side in ((off, "0"), (on, "1")):
        for r in d["results"]:
            if r["backend"] == "commlib":
                both["results"].append(dict(r, algorithm=f"{r['algorithm']}@cma{side}"))
    return both


def test_tune_reads_both_sides_of_one_job_as_it_reads_two_runs(tmp_path):
    from commlib import cli
    paths = _write_runs(tmp_path)
    both = str(tmp_path / "both.json")
    with open(both, "w") as f:
        json.dump(_one_job_of_both_sides(), f)
    two, one = str(tmp_path / "two.json"), str(tmp_path / "one.json")
    assert cli.main(["tune", *paths, "-o", two]) == 0
    assert cli.main(["tune", both, "-o", one]) == 0
    t2, t1 = tuning.read(two), tuning.read(one)
    one_mib = C.core_bytes("all_to_all", 1 << 20, "float32", 4)
    assert t1["single_copy"] == t2["single_copy"] == {"all_to_all": {"4": {"min_bytes": one_mib}}}
    assert t1["collectives"] == t2["collectives"]  # the rows: each size from its side, names without @cma
    # the provenance says what the table came from and how long its runs took
    assert t1["provenance"]["single_copy"] == t2["provenance"]["single_copy"] == "measured by these runs"
    assert [r["single_copy"] for r in t1["provenance"]["runs"]] == ["both"]
    only_off = str(tmp_path / "off.json")
    off = _runs()[0]
    off["config"]["elapsed_s"] = 12.5
    with open(only_off, "w") as f:
        json.dump(off, f)
    assert cli.main(["tune", only_off, "-o", one]) == 0  # on top of the table above: its section is kept
    t0 = tuning.read(one)
    assert t0["single_copy"] == t1["single_copy"] and t0["provenance"]["tuning_seconds"] == 12.5
    assert t0["provenance"]["single_copy"].startswith("kept from the previous file")
    assert not any("@" in row for per in t1["collectives"].values() for e in per.values()
                   for row in json.dumps(e["rows"]).split('"') if row.endswith(("@cma0", "@cma1")))


def test_variant_names_parse_back():
    from commlib.bench import single_copy_ab as ab
    assert ab.parse(ab.variant("rail_ring", "1")) == ("rail_ring", "1")
    assert ab.parse("direct@cma0") == ("direct", "0")
    assert ab.parse("direct") == ("direct", None) and ab.parse("ring@kernel") == ("ring@kernel", None)
    recs = ab.split_records([{"algorithm": "ring@cma1"}, {"algorithm": "auto"}])
    assert recs == [{"algorithm": "ring", "single_copy": "1"}, {"algorithm": "auto"}]


def test_single_copy_only_keeps_every_row(tmp_path):
    """--single-copy-only: the crossover from a --single-copy-ab run, the file's rows untouched."""
    from commlib import cli
    both = str(tmp_path / "both.json")
    with open(both, "w") as f:
        json.dump(_one_job_of_both_sides(), f)
    out = str(tmp_path / "t.json")
    rows = {"all_to_all": {"4": {"source": "measured", "rows": [[-1, "pairwise"]]}}}
    tuning.write(out, {"collectives": rows, "single_copy": {"all_to_all": {"4": {"min_bytes": -1}}}})
    assert cli.main(["tune", both, "-o", out, "--single-copy-only"]) == 0
    t = tuning.read(out)
    assert t["collectives"] == rows
    assert t["single_copy"] == {"all_to_all": {"4": {"min_bytes": C.core_bytes("all_to_all", 1 << 20, "float32", 4)}}}


def test_a_run_under_the_crossover_in_force_is_neither_side(tmp_path):
    # a main-job run (single_copy "auto") whose old crossover ran the large sizes single-copy, fast: were
    # it read as the channels' side, single-copy would seem to lose at the largest size ("never")
    from commlib.bench import single_copy_tuning
    off, on = _runs()
    shipped = copy.deepcopy(on)
    shipped["config"]["single_copy"] = "auto"
    for r in shipped["results"]:
        r["time_us"]["median"] /= 10
    records = []
    for d in (off, on, shipped):
        records += [dict(r, single_copy=d["config"]["single_copy"]) for r in d["results"]]
    one_mib = C.core_bytes("all_to_all", C.geometry("all_to_all", 1 << 20, "float32", 4)[2], "float32", 4)
    assert single_copy_tuning.crossovers(records) == {("all_to_all", 4): one_mib}


def _main_job_run(in_force, fast_from=1 << 20):
    """A main-job run (COMMLIB_CMA=auto, its ranks' "single_copy" section ``in_force`` in its config)
    where pairwise all_to_all is 100x faster than every other series from ``fast_from`` bytes."""
    run = copy.deepcopy(_runs()[1])
    run["config"]["single_copy"] = "auto"
    run["config"]["single_copy_in_force"] = in_force
    for r in run["results"]:
        if r["backend"] == "commlib" and r["algorithm"] == "pairwise" and r["bytes"] >= fast_from:
            r["time_us"]["median"] /= 100
    return run


def test_a_main_job_run_joins_the_side_its_tuning_ran_each_size_on(tmp_path):
    # main-job runs mixed with runs of both sides: above the measured crossover (1 MiB), the rows come
    # from the single-copy side, and a main-job run whose tuning sent those sizes single-copy is of
    # that side (its pairwise, 100x faster, must decide them); one whose tuning said "never" ran them
    # on the channels and is not (the on run's bruck decides). Before the run kept its tuning's
    # section, every main-job record above a crossover was dropped.
    from commlib import cli
    from commlib.bench import single_copy_tuning
    one_mib = C.core_bytes("all_to_all", C.geometry("all_to_all", 1 << 20, "float32", 4)[2], "float32", 4)
    big = C.core_bytes("all_to_all", C.geometry("all_to_all", 16 << 20, "float32", 4)[2], "float32", 4)
    on_from_1m = {"all_to_all": {"4": {"min_bytes": one_mib}}}
    for in_force, expected in ((on_from_1m, "pairwise"), ({}, "bruck"),
                               ({"all_to_all": {"4": {"min_bytes": -1}}}, "bruck"),
                               ({"all_to_all": {"4": {"min_bytes": one_mib, "min_message": 4096}}}, "bruck")):
        paths = _write_runs(tmp_path)
        for i in range(2):  # two of them: the median over the runs is theirs
            paths.append(str(tmp_path / f"main{i}.json"))
            with open(paths[-1], "w") as f:
                json.dump(_main_job_run(in_force), f)
        out = str(tmp_path / "tuning.json")
        if os.path.exists(out):
            os.remove(out)
        assert cli.main(["tune", *paths, "-o", out]) == 0
        table = tuning.read(out)
        assert table["single_copy"] == {"all_to_all": {"4": {"min_bytes": one_mib}}}, in_force
        # (the last: single-copy from 4 KiB messages, a side other than COMMLIB_CMA=1's 64 KiB one)
        assert tuning.choose(table, "all_to_all", big, 4) == expected, in_force
    rec = {"collective": "all_to_all", "world_size": 4, "bytes": 16 << 20, "dtype": "float32"}
    assert single_copy_tuning.side_ran(rec, on_from_1m) == "65536"
    assert single_copy_tuning.side_ran(dict(rec, bytes=4096), on_from_1m) == "0"
    assert single_copy_tuning.side_ran(dict(rec, world_size=3), on_from_1m) == "0"


def test_the_main_job_records_the_single_copy_section_its_ranks_load(tmp_path, monkeypatch):
    from commlib.bench import arguments
    from commlib.core import tuning as core_tuning
    section = {"all_to_all": {"4": {"min_bytes": 12345, "min_message": 4096}}}
    path = str(tmp_path / "t.json")
    core_tuning.write(path, {"collectives": {}, "single_copy": section})
    ns = type("A", (), {})()
    monkeypatch.setenv("COMMLIB_TUNING", path)
    monkeypatch.setenv("COMMLIB_CMA", "auto")
    assert arguments._single_copy_in_force(ns) == section
    monkeypatch.setenv("COMMLIB_TUNING", "0")
    assert arguments._single_copy_in_force(ns) == {}  # no table: no entry, the channels everywhere
    monkeypatch.setenv("COMMLIB_TUNING", path)
    monkeypatch.setenv("COMMLIB_CMA", "1")
    assert arguments._single_copy_in_force(ns) is None  # not auto: the run's COMMLIB_CMA says its side
    ns.single_copy_ab = True
    monkeypatch.setenv("COMMLIB_CMA", "auto")
    assert arguments._single_copy_in_force(ns) is None


def _three_sides(gain_32k: float):
    """_runs()'s off and on (COMMLIB_CMA=1) runs and a third, COMMLIB_CMA=32K: single-copy from 32 KiB
    messages, its times the on run's but for the 4 KiB size, where it beats the channels' best by
    ``gain_32k`` (below 1: it loses there), and 16 MiB, 2.5x the on run's (still beating the channels:
    the noise between two sides that both read every message single-copy there)."""
    off, on = _runs()
    k32 = copy.deepcopy(on)
    k32["config"]["single_copy"] = "32K"
    best_off = min(r["time_us"]["median"] for r in off["results"]
                   if r["backend"] == "commlib" and r["algorithm"] != "auto" and r["bytes"] == 4096)
    for r in k32["results"]:
        if r["backend"] == "commlib" and r["bytes"] == 4096:
            r["time_us"]["median"] = best_off / gain_32k if r["algorithm"] == "pairwise" else 10 * best_off
        elif r["backend"] == "commlib" and r["bytes"] == 16 << 20:
            r["time_us"]["median"] *= 2.5  # still faster than the channels: noise between two on sides
    return [dict(r, single_copy=d["config"]["single_copy"]) for d in (off, on, k32) for r in d["results"]]


def test_the_side_with_a_smaller_message_wins_where_it_is_faster():
    # a 32K side that wins from 4 KiB calls (the 64 KiB side from 1 MiB) gives the entry its crossover
    # and its smallest message, however the sides' rows above both crossovers compare,
    # and the rows from 4 KiB come from its records (pairwise, its fastest there; bruck off the 32K side)
    records = _three_sides(gain_32k=2.0)
    table = tuning.from_results(records)
    four_k = C.core_bytes("all_to_all", 4096, "float32", 4)
    assert table["single_copy"] == {"all_to_all": {"4": {"min_bytes": four_k, "min_message": 32 << 10}}}
    assert tuning.choose(table, "all_to_all", four_k, 4) == "pairwise"
    # losing at 4 KiB, the 32K side's crossover is the 1 MiB of COMMLIB_CMA=1's: equal crossovers go
    # to the lower time over the sizes, the 64 KiB side's (the entry names no smallest message)
    tied = tuning.from_results(_three_sides(gain_32k=0.9))
    one_mib = C.core_bytes("all_to_all", C.geometry("all_to_all", 1 << 20, "float32", 4)[2], "float32", 4)
    assert tied["single_copy"] == {"all_to_all": {"4": {"min_bytes": one_mib}}}


def test_an_entrys_smallest_message_installs_into_the_core(monkeypatch):
    monkeypatch.setenv("COMMLIB_CMA", "auto")
    coll = COLLECTIVE["all_to_all"]
    try:
        tuning.install({"single_copy": {"all_to_all": {"4": {"min_bytes": 1 << 15, "min_message": 1 << 15},
                                                       "8": {"min_bytes": 1 << 20}}}})
        assert _C.single_copy_min_message(coll, 1 << 15, 4) == 1 << 15
        assert _C.single_copy_min_message(coll, (1 << 15) - 1, 4) == -1
        assert _C.single_copy_min_message(coll, 1 << 20, 8) == 64 << 10  # an entry naming none
    finally:
        _C.clear_tuning()
        tuning.load_default()
    for bad in (1, 0, "32K", True):
        with pytest.raises(ValueError, match="all_to_all world size 4: min_message"):
            tuning.install({"single_copy": {"all_to_all": {"4": {"min_bytes": 0, "min_message": bad}}}},
                           core=_Recorder())
    # The core's own checks name the collective and world size as the loader does.
    with pytest.raises(ValueError, match="all_to_all min_message for world size 8 without a min_bytes"):
        _C.set_single_copy_crossovers(coll, {4: 0}, {8: 1 << 15})
    with pytest.raises(ValueError, match="all_to_all world size 4: min_message must be >= 2"):
        _C.set_single_copy_crossovers(coll, {4: 0}, {4: 1})
    with pytest.raises(ValueError, match="all_to_all world size 4: min_bytes must be -1"):
        _C.set_single_copy_crossovers(coll, {4: -2})
    with pytest.raises(ValueError, match="all_to_all world size 0: the world size must be >= 1"):
        _C.set_single_copy_crossovers(coll, {0: 0})


class _Recorder:
    """A core that records what install gives it (nothing reaches the engine)."""

    def __init__(self):
        self.calls = []

    def set_tuning(self, collective, rows):
        self.calls.append(("rows", collective, rows))

    def set_single_copy_crossovers(self, collective, min_bytes, min_message=None):
        self.calls.append(("single_copy", collective, min_bytes, min_message))
