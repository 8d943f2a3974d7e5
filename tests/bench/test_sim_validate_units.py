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


def test_a_missing_summary_stops_the_script_naming_the_file(tmp_path):
    """sim_tcp's, sim_cores' and the shared-memory section's inputs, and the CSV sim_cores
    summarises: a missing one is a SystemExit naming its path and the command that makes it (no
    section written without data)."""
    import pytest
    import sim_cores
    import sim_tcp
    from commlib.perf.common import fmt_bytes

    cases = [
        (lambda: sim_tcp.section([], str(tmp_path), None, "", fmt_bytes), "tcp_1gbit_h2x1.json", "--measure as root"),
        (lambda: sim_cores.section([], str(tmp_path), fmt_bytes), "shm_np248.json", "sim_cores.py --summarize"),
        (lambda: sim_cores.summarize_csv(str(tmp_path), str(tmp_path / "out.json")), "summary.csv", "bench/results.py"),
        (lambda: sv.measured_vs_predicted([], str(tmp_path / "np2.json")), "np2.json", "--bench"),
    ]
    for run, name, how in cases:
        with pytest.raises(SystemExit) as info:
            run()
        msg = str(info.value.code)
        assert msg.startswith(f"missing input {tmp_path}") and name in msg and how in msg, msg


def test_sim_cores_summary_needs_every_run_in_the_csv(tmp_path):
    import pytest
    import sim_cores
    csv_path = tmp_path / sim_cores.CSV
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text('# run np2 {"machine": {}}\nrun,backend\n')
    with pytest.raises(SystemExit, match="no '# run' line for np4, np8"):
        sim_cores.summarize_csv(str(tmp_path), str(tmp_path / "out.json"))
