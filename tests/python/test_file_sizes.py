"""No source file over ~400 lines (small files, one seam each: docs/DESIGN.md): a file that grows
past the limit fails this test, naming it."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 400
FOLDERS = ("csrc", "commlib", "tests", "bench", "scripts", "examples")
SOURCES = (".py", ".cc", ".h", ".cu", ".cuh", ".sh")


def source_lengths():
    """{path relative to the repository: lines} of every source file under FOLDERS."""
    out = {}
    for folder in FOLDERS:
        for d, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
            for f in files:
                if f.endswith(SOURCES):
                    path = os.path.join(d, f)
                    with open(path, errors="replace") as fh:
                        out[os.path.relpath(path, ROOT)] = sum(1 for _ in fh)
    return out


def test_no_file_over_the_limit():
    lengths = source_lengths()
    assert "csrc/host/communicator.cc" in lengths and "commlib/core/communicator.py" in lengths
    over = sorted(f"{p}: {n} lines" for p, n in lengths.items() if n > LIMIT)
    assert not over, f"files over {LIMIT} lines (split them along a seam):\n" + "\n".join(over)
