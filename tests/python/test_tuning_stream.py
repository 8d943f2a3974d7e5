"""The tuning file's "stream" section at run time (commlib.core.tuning.streaming_starts/install,
csrc/policy/stream_stores.h): read and checked, merged per machine class, installed in the core (a
table without the section clears the entries, as _C.clear_tuning does)."""
import json

import pytest

import commlib._C as _C
from commlib.core import tuning

pytestmark = pytest.mark.timeout(60)

XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}
NONE = -2  # no entry: the footprint rule decides (kStreamNoEntry)


def _table():
    return {"schema": tuning.SCHEMA, "collectives": {},
            "stream": {"all_gather": {"4": {"min_bytes": 4 << 20}}, "broadcast": {"4": {"min_bytes": 0}}},
            "machines": [{"machine": XEON, "stream": {"all_gather": {"4": {"min_bytes": -1}},
                                                      "all_to_all": {"8": {"min_bytes": 1 << 20}}}}]}


@pytest.fixture
def restored(monkeypatch):
    yield
    monkeypatch.undo()
    _C.clear_tuning()
    tuning.load_default()


def test_the_section_is_read_and_merged_per_machine():
    t = _table()
    assert tuning.streaming_starts(t) == {"all_gather": {4: 4 << 20}, "broadcast": {4: 0}}
    on_xeon = tuning.streaming_starts(tuning.for_machine(t, XEON))
    assert on_xeon == {"all_gather": {4: -1}, "broadcast": {4: 0}, "all_to_all": {8: 1 << 20}}
    assert tuning.streaming_starts(tuning.for_machine(t, dict(XEON, cores=4))) == tuning.streaming_starts(t)


@pytest.mark.parametrize("entry, match", [
    ({"min_bytes": -2}, r"stream: all_gather world size 4: min_bytes must be an integer >= -1, got -2"),
    ({"min_bytes": "4M"}, r"min_bytes must be an integer >= -1, got '4M'"),
    ({"min_bytes": False}, r"min_bytes must be an integer >= -1, got False"),
    ({}, r"min_bytes must be an integer >= -1, got None"),
])
def test_a_bad_entry_is_named(entry, match):
    with pytest.raises(ValueError, match=match):
        tuning.streaming_starts({"stream": {"all_gather": {"4": entry}}})
    with pytest.raises(ValueError, match="world size must be an integer >= 1, got '0'"):
        tuning.streaming_starts({"stream": {"all_gather": {"0": {"min_bytes": 1}}}})
    with pytest.raises(ValueError, match="all_gatherr"):
        tuning.streaming_starts({"stream": {"all_gatherr": {"4": {"min_bytes": 1}}}})


def test_the_core_checks_entries_too():
    with pytest.raises(ValueError, match=r"stream: all_gather world size 4: min_bytes must be -1 \(never\) or >= 0"):
        _C.set_streaming_starts({_C.Collective.all_gather: {4: -2}})
    with pytest.raises(ValueError, match=r"stream: broadcast world size 0: the world size must be >= 1"):
        _C.set_streaming_starts({_C.Collective.broadcast: {0: 10}})


def test_install_replaces_the_entries_and_a_table_without_them_clears(restored):
    tuning.install(tuning.for_machine(_table(), XEON))
    assert _C.streaming_start(_C.Collective.all_gather, 4) == -1
    assert _C.streaming_start(_C.Collective.all_to_all, 8) == 1 << 20
    assert _C.streaming_start(_C.Collective.broadcast, 4) == 0
    assert _C.streaming_start(_C.Collective.all_reduce, 4) == NONE
    tuning.install({"collectives": {}})
    assert _C.streaming_start(_C.Collective.all_gather, 4) == NONE
    tuning.install(_table())
    assert _C.streaming_start(_C.Collective.all_gather, 4) == 4 << 20
    _C.clear_tuning()
    assert _C.streaming_start(_C.Collective.all_gather, 4) == NONE


def test_load_default_installs_the_files_entries(tmp_path, monkeypatch, restored):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_table()))
    monkeypatch.setenv("COMMLIB_TUNING", str(path))
    monkeypatch.setattr(tuning, "this_machine", lambda: dict(XEON))
    assert tuning.load_default() is True
    assert _C.streaming_start(_C.Collective.all_gather, 4) == -1
