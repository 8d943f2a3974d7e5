"""The bench report links to the explorer: a page per collective compared, carrying the algorithms
and world sizes it measured, a link per (collective, world size, algorithm); `commlib report` hands
the report its page writer."""
import json
import os
import sys

from commlib import explain
from commlib.bench.report_doc import Doc
from commlib.bench.report_sections import add_explorer
from commlib.explain.report import write_pages

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import synth  # noqa: E402  (tests/bench: synthetic bench results)


def test_report_links_every_compared_algorithm(tmp_path):
    rows = [
        {"collective": "all_reduce", "world_size": 4, "times": {"ring": 1.0, "auto": 1.0, "hierarchical/ring": 2.0}},
        {"collective": "all_reduce", "world_size": 2, "times": {"rabenseifner": 1.0}},
        {"collective": "all_reduce", "world_size": 1, "times": {"ring": 1.0}},
        {"collective": "broadcast", "world_size": 32, "times": {"binomial": 1.0}},  # beyond what it draws
    ]
    stale = tmp_path / "explorer" / "scatter.html"
    stale.parent.mkdir()
    stale.write_text("from an earlier report")
    doc = Doc()
    add_explorer(doc, rows, str(tmp_path), write_pages)
    md, html = doc.markdown(), doc.html("t")
    assert "## See the algorithms move" in md
    for P, alg in ((4, "ring"), (2, "rabenseifner")):
        href = f"explorer/all_reduce.html#alg={alg}&P={P}&count=8"
        assert f"- [all_reduce, {P} ranks: {alg}]({href})" in md
        assert f'<a href="{href.replace("&", "&amp;")}">' in html
    assert "alg=auto" not in md and "alg=hierarchical" not in md
    assert "broadcast" not in md and not (tmp_path / "explorer" / "broadcast.html").exists()
    assert not stale.exists()
    data = explain.embedded_data((tmp_path / "explorer" / "all_reduce.html").read_text())
    assert [a["name"] for a in data["algorithms"]] == ["rabenseifner", "ring"]
    assert data["sizes"] == [2, 4] and data["counts"] == [8]
    assert set(data["cases"]) == {f"{a}/{P}/8" for a in ("rabenseifner", "ring") for P in (2, 4)}


def test_no_section_without_an_algorithm_to_show(tmp_path):
    doc = Doc()
    add_explorer(doc, [{"collective": "barrier", "world_size": 4, "times": {"dissemination": 1.0}}], str(tmp_path),
                 write_pages)
    assert doc.items == []


def test_commlib_report_has_the_section(tmp_path):
    from commlib.cli import main
    f = tmp_path / "run.json"
    f.write_text(json.dumps(synth.data(P=2, sizes=(8,), collectives=("all_gather",), mpi=False)))
    assert main(["report", str(f), "-o", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## See the algorithms move" in md and "(explorer/all_gather.html#alg=" in md
    data = explain.embedded_data((tmp_path / "rep" / "explorer" / "all_gather.html").read_text())
    assert data["sizes"] == [2]
