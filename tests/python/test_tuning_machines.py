"""Tuning tables per machine class (commlib.core.tuning.for_machine): the shipped file's top level is one
machine class's table, its ``"machines"`` sections other classes'; the machine that imports commlib
gets its own class's entries, per (collective, world size), and ``commlib tune --machine-section``
writes a section without touching the rest."""
import json

import pytest

from commlib.core import tuning

pytestmark = pytest.mark.timeout(60)

AMD = {"cpu": "AMD EPYC", "cores": 2}
XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}


def _table():
    return {"schema": tuning.SCHEMA,
            "machine": dict(AMD, hostname="vm"),
            "collectives": {"all_gather": {"2": {"rows": [[-1, "ring"]]},
                                           "4": {"rows": [[1024, "direct"], [-1, "rail_ring"]]}},
                            "all_reduce": {"4": {"rows": [[-1, "tree"]]}}},
            "single_copy": {"all_to_all": {"4": {"min_bytes": 524288}, "8": {"min_bytes": 2097152}}},
            "machines": [{"machine": XEON,
                          "collectives": {"all_gather": {"4": {"rows": [[-1, "recursive_doubling"]]}}},
                          "single_copy": {"all_to_all": {"4": {"min_bytes": -1}}}}]}


def test_a_machines_section_replaces_only_the_entries_it_names():
    t = _table()
    on_xeon = tuning.for_machine(t, XEON)
    assert on_xeon["machine_section"] == 0 and "machines" not in on_xeon
    assert tuning.choose(on_xeon, "all_gather", 4096, 4) == "recursive_doubling"  # the section's world size
    assert tuning.choose(on_xeon, "all_gather", 4096, 2) == "ring"  # another world size: the top level's
    assert tuning.choose(on_xeon, "all_reduce", 4096, 4) == "tree"  # a collective it does not name
    assert tuning.single_copy_crossovers(on_xeon)["all_to_all"] == {4: -1, 8: 2097152}
    assert t["collectives"]["all_gather"]["4"]["rows"][-1] == [-1, "rail_ring"]  # not changed in place
    for other in (AMD, dict(XEON, cores=4), {"cpu": "Intel(R) Xeon(R) Platinum", "cores": 2}):
        top = tuning.for_machine(t, other)
        assert top["machine_section"] is None
        assert tuning.choose(top, "all_gather", 4096, 4) == "rail_ring"
        assert tuning.single_copy_crossovers(top)["all_to_all"] == {4: 524288, 8: 2097152}


def test_load_default_installs_this_machines_section(tmp_path, monkeypatch):
    import commlib._C as _C
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_table()))
    monkeypatch.setenv("COMMLIB_TUNING", str(path))
    try:
        for machine, want in ((XEON, "recursive_doubling"), (AMD, "rail_ring")):
            monkeypatch.setattr(tuning, "this_machine", lambda m=machine: dict(m))
            _C.clear_tuning()
            assert tuning.load_default() is True
            assert _C.choose_algorithm(_C.Collective.all_gather, "auto", 4096, 4) == want
            assert _C.choose_algorithm(_C.Collective.all_gather, "auto", 4096, 2) == "ring"
    finally:
        monkeypatch.delenv("COMMLIB_TUNING")
        monkeypatch.undo()
        _C.clear_tuning()
        tuning.load_default()


def test_a_malformed_section_is_named(tmp_path, monkeypatch):
    t = _table()
    t["machines"][0]["machine"] = {"cpu": "x"}  # no cores
    path = tmp_path / "t.json"
    path.write_text(json.dumps(t))
    monkeypatch.setenv("COMMLIB_TUNING", str(path))
    with pytest.raises(tuning.TuningFileError, match=r"t\.json: machines\[0\]: needs"):
        tuning.load_default()
    t["machines"] = {"cpu": "x"}
    path.write_text(json.dumps(t))
    with pytest.raises(tuning.TuningFileError, match="machines: must be a list"):
        tuning.load_default()


def test_the_shipped_sections_install_on_their_machines():
    # every class the shipped file carries installs (valid algorithm names for each collective), and
    # the Intel Xeon 2-core class measured in session 29 is one of them
    import commlib._C as _C
    raw = tuning.read_strict(tuning.default_path())
    machines = [s["machine"] for s in raw.get("machines", [])]
    assert XEON in machines
    try:
        for m in machines + [{"cpu": raw["machine"]["cpu"], "cores": raw["machine"]["cores"]}]:
            t = tuning.for_machine(raw, m)
            _C.clear_tuning()
            assert tuning.install(t)
    finally:
        _C.clear_tuning()
        tuning.load_default()
