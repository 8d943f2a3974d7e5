"""The test tree's own rule: every module under tests/ has a unique file name. The test directories
are not packages, so pytest (rootdir-relative, "import file mismatch") and the rank processes
(which import a case module by its bare name) would take one same-named module for another."""
import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_module_names_are_unique_across_test_directories():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and "__pycache__" not in path.parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
