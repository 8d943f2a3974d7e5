"""The tuning file's "flags" section at run time (commlib.core.tuning.flag_cutoffs/install,
csrc/policy/flag_cutoff.h): read and checked, merged per machine class, installed in the core (a
table without the section clears the cutoffs), and what auto then routes through the flags."""
import json

import pytest

import commlib._C as _C
from commlib.core import tuning

pytestmark = pytest.mark.timeout(60)

XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}
ANY = 2**63 - 1  # no entry: the slot decides (kFlagsAnySize)


def _table():
    return {"schema": tuning.SCHEMA, "collectives": {},
            "flags": {"all_reduce": {"4": {"max_bytes": 4096}, "8": {"max_bytes": 1024}}},
            "machines": [{"machine": XEON, "flags": {"all_reduce": {"4": {"max_bytes": -1}},
                                                     "all_gather": {"3": {"max_bytes": 512}}}}]}


@pytest.fixture
def restored(monkeypatch):
    yield
    monkeypatch.undo()  # (COMMLIB_TUNING and this_machine back first: the shipped table again)
    _C.clear_tuning()
    tuning.load_default()


def test_the_section_is_read_and_merged_per_machine():
    t = _table()
    assert tuning.flag_cutoffs(t) == {"all_reduce": {4: 4096, 8: 1024}}
    on_xeon = tuning.for_machine(t, XEON)
    assert tuning.flag_cutoffs(on_xeon) == {"all_reduce": {4: -1, 8: 1024}, "all_gather": {3: 512}}
    assert tuning.flag_cutoffs(tuning.for_machine(t, dict(XEON, cores=4))) == tuning.flag_cutoffs(t)


@pytest.mark.parametrize("entry, match", [
    ({"max_bytes": -2}, r"flags: all_reduce world size 4: max_bytes must be an integer >= -1, got -2"),
    ({"max_bytes": "4K"}, r"max_bytes must be an integer >= -1, got '4K'"),
    ({"max_bytes": True}, r"max_bytes must be an integer >= -1, got True"),
    ({}, r"max_bytes must be an integer >= -1, got None"),
])
def test_a_bad_entry_is_named(entry, match):
    with pytest.raises(ValueError, match=match):
        tuning.flag_cutoffs({"flags": {"all_reduce": {"4": entry}}})
    with pytest.raises(ValueError, match="unknown|all_reducee"):
        tuning.flag_cutoffs({"flags": {"all_reducee": {"4": {"max_bytes": 1}}}})


def test_the_core_checks_entries_too():
    with pytest.raises(ValueError, match=r"flags: all_reduce world size 4: max_bytes must be -1 \(never\) or >= 0"):
        _C.set_flag_cutoffs({_C.Collective.all_reduce: {4: -2}})
    with pytest.raises(ValueError, match=r"flags: all_gather world size 0: the world size must be >= 1"):
        _C.set_flag_cutoffs({_C.Collective.all_gather: {0: 10}})


def test_install_replaces_the_cutoffs_and_a_table_without_them_clears(restored):
    tuning.install(tuning.for_machine(_table(), XEON))
    assert _C.flag_cutoff(_C.Collective.all_reduce, 4) == -1
    assert _C.flag_cutoff(_C.Collective.all_reduce, 8) == 1024
    assert _C.flag_cutoff(_C.Collective.all_gather, 3) == 512
    assert _C.flag_cutoff(_C.Collective.all_gather, 4) == ANY
    tuning.install({"collectives": {}})
    assert _C.flag_cutoff(_C.Collective.all_reduce, 8) == ANY
    tuning.install(_table())
    assert _C.flag_cutoff(_C.Collective.all_reduce, 4) == 4096
    _C.clear_tuning()
    assert _C.flag_cutoff(_C.Collective.all_reduce, 4) == ANY


def test_load_default_installs_the_files_cutoffs(tmp_path, monkeypatch, restored):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_table()))
    monkeypatch.setenv("COMMLIB_TUNING", str(path))
    monkeypatch.setattr(tuning, "this_machine", lambda: dict(XEON))
    assert tuning.load_default() is True
    assert _C.flag_cutoff(_C.Collective.all_reduce, 4) == -1
    t = _table()
    t["machines"][0]["flags"]["all_reduce"]["4"]["max_bytes"] = -3  # (the machine section's entry: it is read)
    path.write_text(json.dumps(t))
    with pytest.raises(tuning.TuningFileError, match=r"t\.json: flags: all_reduce world size 4"):
        tuning.load_default()
