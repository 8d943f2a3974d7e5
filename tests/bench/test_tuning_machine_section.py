"""``commlib tune --machine-section`` (commlib.bench.tuning.write_machine_section): the measured entries of
runs of one machine class become that class's section of a tuning file, replacing its old one, with the
file's top level and other classes' sections kept."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import synth  # noqa: E402
from commlib.bench import tuning as bench_tuning  # noqa: E402
from commlib.core import tuning  # noqa: E402

pytestmark = pytest.mark.timeout(60)

AMD = {"cpu": "AMD EPYC", "cores": 2}
XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}


def test_tune_writes_a_machine_section_and_keeps_the_rest(tmp_path):
    d = synth.data(P=4, sizes=(8, 4096, 1 << 20))
    d["machine"] = dict(XEON, hostname="vm")
    path = tmp_path / "t.json"
    base = {"schema": tuning.SCHEMA, "machine": dict(AMD, hostname="vm"),
            "collectives": {"all_reduce": {"4": {"rows": [[-1, "tree"]]}}},
            "single_copy": {"all_to_all": {"4": {"min_bytes": 524288}}}}
    base["machines"] = [{"machine": XEON, "collectives": {"broadcast": {"4": {"rows": [[-1, "binomial"]]}}}},
                        {"machine": {"cpu": "other", "cores": 8}, "collectives": {}}]
    path.write_text(json.dumps(base))
    assert bench_tuning.write_machine_section(str(path), [d]) == 0
    out = json.loads(path.read_text())
    assert {k: out[k] for k in ("collectives", "single_copy", "machine")} == {
        k: base[k] for k in ("collectives", "single_copy", "machine")}  # the top level as it was
    secs = {s["machine"]["cpu"]: s for s in out["machines"]}
    assert set(secs) == {"other", XEON["cpu"]} and len(out["machines"]) == 2  # replaced, not added twice
    sec = secs[XEON["cpu"]]
    assert set(sec["collectives"]) == set(synth.ALGOS) and all(set(per) == {"4"} for per in sec["collectives"].values())
    assert all(e["source"] == "measured" for per in sec["collectives"].values() for e in per.values())
    on_xeon = tuning.for_machine(out, XEON)
    table = bench_tuning.from_runs([d])
    for coll in synth.ALGOS:
        assert on_xeon["collectives"][coll]["4"]["rows"] == table["collectives"][coll]["4"]["rows"]
    d2 = dict(d, machine=dict(AMD))
    with pytest.raises(SystemExit, match="one machine class"):
        bench_tuning.write_machine_section(str(path), [d, d2])


def test_a_retune_from_main_job_runs_keeps_the_replaced_sections_single_copy_crossovers(tmp_path):
    # Main-job runs (COMMLIB_CMA=auto) measure one side per size, so they cannot place a crossover:
    # the class's crossovers from its last --single-copy-ab stay, or its large calls would silently
    # go back to the channels.
    d = synth.data(P=4, sizes=(8, 4096, 1 << 20))
    d["machine"] = dict(XEON, hostname="vm")
    crossovers = {"all_to_all": {"4": {"min_bytes": 131072, "min_message": 32768}}}
    path = tmp_path / "t.json"
    base = {"schema": tuning.SCHEMA, "machine": dict(AMD, hostname="vm"), "collectives": {},
            "single_copy": {"all_gather": {"4": {"min_bytes": -1}}},
            "machines": [{"machine": XEON, "collectives": {}, "single_copy": crossovers},
                         {"machine": AMD, "collectives": {}}]}
    path.write_text(json.dumps(base))
    assert bench_tuning.write_machine_section(str(path), [d]) == 0
    secs = {s["machine"]["cpu"]: s for s in json.loads(path.read_text())["machines"]}
    assert secs[XEON["cpu"]]["single_copy"] == crossovers
    assert secs[XEON["cpu"]]["provenance"]["single_copy"].startswith("kept from the section this one replaced")
    assert "single_copy" not in secs[AMD["cpu"]]
    # a class with no crossovers before gets none (not the top level's, nor another class's)
    d["machine"] = dict(AMD, hostname="vm")
    assert bench_tuning.write_machine_section(str(path), [d]) == 0
    secs = {s["machine"]["cpu"]: s for s in json.loads(path.read_text())["machines"]}
    assert "single_copy" not in secs[AMD["cpu"]] and secs[AMD["cpu"]]["provenance"]["single_copy"] == "none"
    assert secs[XEON["cpu"]]["single_copy"] == crossovers
