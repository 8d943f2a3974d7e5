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
