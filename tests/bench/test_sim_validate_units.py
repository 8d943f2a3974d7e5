"""bench/sim_validate.py's committed-data sections: each reads its file from bench/sim_data/ or stops
the script (SystemExit, non-zero) naming the file and the command that makes it."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import sim_validate as sv  # noqa: E402


def test_sections_e_and_f_stop_the_script_when_their_data_is_missing(tmp_path, monkeypatch):
    """A validation that writes a hint and exits 0 hides the failure: a missing committed input of
    (e) or (f) is a SystemExit (non-zero) naming the file and the command that remakes it."""
    monkeypatch.setattr(sv, "DATA", str(tmp_path))
    for section, name, how in ((sv.auto_at_scale, "scale.json", sv.SCALE_HOW),
                               (sv.auto_speed, "auto_speed.md", sv.AUTO_SPEED_HOW)):
        lines = []
        with pytest.raises(SystemExit) as info:
            section(lines)
        msg = str(info.value.code)
        assert msg == f"missing input {tmp_path / name}: run `{how}`", msg
        assert lines == []


def test_sections_e_and_f_stop_the_script_when_their_data_is_invalid(tmp_path, monkeypatch):
    monkeypatch.setattr(sv, "DATA", str(tmp_path))
    cases = [(sv.auto_at_scale, "scale.json", "{not json", "invalid input"),
             (sv.auto_at_scale, "scale.json", "[1, 2]", "invalid input"),
             (sv.auto_at_scale, "scale.json", '{"rows": [], "jobs": 2}', "(no t4096, wall_s)"),
             (sv.auto_speed, "auto_speed.md", "\n  \n", "(empty)")]
    for section, name, text, what in cases:
        (tmp_path / name).write_text(text)
        with pytest.raises(SystemExit) as info:
            section([])
        msg = str(info.value.code)
        assert msg.startswith(f"invalid input {tmp_path / name}") and what in msg and "run `" in msg, msg


def test_section_f_copies_its_committed_table(tmp_path, monkeypatch):
    monkeypatch.setattr(sv, "DATA", str(tmp_path))
    (tmp_path / "auto_speed.md").write_text("| a | b |\n")
    lines = []
    sv.auto_speed(lines)
    assert lines[2:] == ["| a | b |", ""]


def test_main_stops_before_writing_when_section_e_input_is_missing(tmp_path, monkeypatch):
    """Through main(): the SystemExit carries a message (Python exits 1 with it on stderr) and no
    RESULTS file is written. The sections before (e) are stubbed: they are covered above and take
    seconds."""
    monkeypatch.setattr(sv, "DATA", str(tmp_path))
    for name in ("closed_forms", "measured_vs_predicted", "small_messages"):
        monkeypatch.setattr(sv, name, lambda *a, **k: None)
    for mod in (sv.sim_tcp, sv.sim_cores):
        monkeypatch.setattr(mod, "section", lambda *a, **k: None)
    out = tmp_path / "out.md"
    with pytest.raises(SystemExit) as info:
        sv.main(["-o", str(out)])
    assert isinstance(info.value.code, str) and "scale.json" in info.value.code
    assert not out.exists()


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


def test_rails_section_writes_small_flat_ring_cells_lists_the_unrun_and_predicts_per_column():
    """(g) at 1024 nodes (session 29): a flat ring's busbw under 1 GB/s keeps two decimals (0.16,
    not 0.2), every cell of a table shown that no run filled is listed as not simulated, and a
    prediction of another column than auto (PREDICTIONS' fourth field) is set beside that column's
    result."""
    import sim_rails as sr
    point = lambda t, n, alg, s, b: {"topology": t, "nodes": n, "algorithm": alg, "bytes": s,  # noqa: E731
                                     "busbw_GBps": b, "resolved": alg, "wall_s": 1.0}
    pts = [point(sr._topology(t, nics).name, n, "rail_ring", sr.BIG, 380.0)
           for _, t, nics, ns, _, _ in sr.PUBLISHED for n in ns]
    pts.append(point("dgx-h100", 1024, "ring", 1 << 20, 0.1567))
    text = "\n".join(sr.markdown({"points": pts, "jobs": 1, "wall_s": 1.0}))
    assert "| 1 MiB | 0.16 | - | - | - |" in text
    unrun = next(line for line in text.splitlines() if line.startswith('Not simulated ("-" above), 1024 nodes'))
    assert "dgx-h100 ring at 4 MiB, 16 MiB, 64 MiB, 256 MiB, 1 GiB;" in unrun
    assert "dgx-h100 rail_ring at 1 MiB, 4 MiB" in unrun and sr.UNRUN_WHY[1024] in unrun
    ring = next(line for line in text.splitlines() if line.startswith("Predicted") and "(ring, busbw" in line)
    assert "dgx-h100 1024 nodes 1 MiB: never simulated before, predicted 0.14-0.16, the table 0.16;" in ring
    # each point's commit (session 34), counted; points from before it say so
    pts[-1]["commit"] = "abcd1234"
    text = "\n".join(sr.markdown({"points": pts, "jobs": 1, "wall_s": 1.0}))
    assert f"simulated at (recorded since session 34; a model change after a point's run leaves it stale until " \
           f"rerun): not recorded: {len(pts) - 1}; abcd1234: 1." in text
