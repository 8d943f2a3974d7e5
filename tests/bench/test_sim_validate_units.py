"""bench/sim_validate.py's committed-data sections: each reads its file from bench/sim_data/ or says,
in one line, which command makes it (one helper for both, `committed`)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import sim_validate as sv  # noqa: E402


def test_committed_gives_the_path_or_the_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(sv, "DATA", str(tmp_path))
    lines = []
    assert sv.committed(lines, "x.json", "make x") is None
    assert lines == ["No bench/sim_data/x.json: run `make x`.", ""]
    (tmp_path / "x.json").write_text("{}")
    assert sv.committed(lines, "x.json", "make x") == str(tmp_path / "x.json") and len(lines) == 2


def test_sections_e_and_f_name_the_command_when_their_data_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(sv, "DATA", str(tmp_path))
    lines = []
    sv.auto_at_scale(lines)
    sv.auto_speed(lines)
    assert lines[2] == "No bench/sim_data/scale.json: run `bench/sim_scale.py --json bench/sim_data/scale.json`."
    assert lines[6] == ("No bench/sim_data/auto_speed.md: run "
                        "`bench/sim_auto_speed.py > bench/sim_data/auto_speed.md`.")
    (tmp_path / "auto_speed.md").write_text("| a | b |\n")
    lines = []
    sv.auto_speed(lines)
    assert lines[2:] == ["| a | b |", ""]
