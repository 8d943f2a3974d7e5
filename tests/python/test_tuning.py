"""The run-time half of auto's tuning (commlib.core.tuning): a missing default file is fine, a broken
file is reported by name (never swallowed), and `import commlib` survives a broken file with a
warning that names it."""
import json
import os
import subprocess
import sys

import pytest

from commlib.core import tuning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_load_default_reports_what_is_wrong(tmp_path, monkeypatch):
    missing = tmp_path / "missing.json"
    monkeypatch.setenv("COMMLIB_TUNING", str(missing))
    with pytest.raises(OSError, match="missing.json"):
        tuning.load_default()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv("COMMLIB_TUNING", str(bad))
    with pytest.raises(tuning.TuningFileError, match="bad.json: not JSON"):
        tuning.load_default()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": tuning.SCHEMA,
                                 "collectives": {"all_reduce": {"2": {"rows": [[-1, "no_such_algo"]]}}}}))
    monkeypatch.setenv("COMMLIB_TUNING", str(wrong))
    with pytest.raises(tuning.TuningFileError, match="wrong.json: .*no_such_algo"):
        tuning.load_default()
    monkeypatch.setenv("COMMLIB_TUNING", "0")
    assert tuning.load_default() is False
    monkeypatch.delenv("COMMLIB_TUNING")
    assert tuning.load_default() is os.path.exists(tuning.default_path())


def test_import_warns_about_a_broken_tuning_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    env = dict(os.environ, COMMLIB_TUNING=str(bad), PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", "import commlib; print(commlib.algorithms('all_reduce')[0])"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ring", r.stderr
    assert "tuning file not used" in r.stderr and "bad.json" in r.stderr, r.stderr


def test_install_and_choose_agree_with_the_core():
    import commlib._C as _C
    table = {"schema": tuning.SCHEMA, "collectives": {"all_gather": {"3": {"rows": [[100, "bruck"], [-1, "direct"]]}}}}
    try:
        assert tuning.install(table) == ["all_gather"]
        for nbytes in (8, 100, 101, 1 << 20):
            assert _C.choose_algorithm(_C.Collective.all_gather, "auto", nbytes, 3) == tuning.choose(table, "all_gather", nbytes, 3)
        assert tuning.choose(table, "all_gather", 8, 3) == "bruck"
        assert tuning.choose(table, "all_gather", 101, 3) == "direct"
    finally:
        _C.set_tuning(_C.Collective.all_gather, [])
        tuning.load_default()


def test_kernel_path_rows_install_beside_the_host_rows_and_never_answer_a_host_call():
    import commlib._C as _C
    seen = {}

    class Recorder:
        @staticmethod
        def set_tuning(coll, rows):
            seen[coll] = rows
    table = {"schema": tuning.SCHEMA, "collectives": {"all_reduce": {"3": {"rows": [[-1, "tree"]]}}},
             "kernel_path": {"all_reduce": {"3": {"rows": [[100, "ring"], [-1, "direct"]]}},
                             "all_gather": {"4": {"rows": [[-1, "ring"]]}}}}
    assert tuning.install(table, Recorder) == ["all_gather", "all_reduce"]
    assert seen == {"all_reduce": [(3, -1, "tree", 1), (3, 100, "ring", 1, True), (3, -1, "direct", 1, True)],
                    "all_gather": [(4, -1, "ring", 1, True)]}
    try:
        tuning.install(table)
        for nbytes in (8, 1 << 20):  # the host's resolution reads the host rows only
            assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", nbytes, 3) == "tree"
        assert tuning.choose(table, "all_reduce", 8, 3) == "tree"
    finally:
        _C.clear_tuning()
        tuning.load_default()
