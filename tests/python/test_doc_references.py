"""References to the design documents name sections that exist: docs/DESIGN.md has named
sections, not numbered ones, so a "DESIGN.md §N" reference points at a document outside the repo
(a clone has only what is in it)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCANNED = ("csrc", "commlib", "tests", "bench", "docs", "scripts", "examples")
SUFFIXES = {".py", ".cc", ".h", ".cu", ".cuh", ".md", ".sh"}


def numbered_references(text: str):
    return re.findall(r"DESIGN\.md\s*§\s*\d+", text)


def test_the_scan_finds_a_numbered_reference():
    ref = "DESIGN.md " + "\u00a7" + "3"  # spelt in pieces so this file does not match itself
    assert numbered_references(f"see {ref}'s closed forms") == [ref]
    assert numbered_references('see docs/simulator.md "Closed forms"') == []


def test_no_numbered_design_references():
    bad = []
    for top in SCANNED:
        for path in (ROOT / top).rglob("*"):
            if path.suffix in SUFFIXES and path.is_file():
                for ref in numbered_references(path.read_text(errors="replace")):
                    bad.append(f"{path.relative_to(ROOT)}: {ref}")
    bad += [f"README.md: {r}" for r in numbered_references((ROOT / "README.md").read_text())]
    assert not bad, "references to numbered DESIGN.md sections (the repo's has named ones):\n" + "\n".join(bad)
