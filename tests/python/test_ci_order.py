"""CI's order of modules (tests/module_order.py): the longest modules, by tests/module_seconds.txt, are
handed to the xdist workers first, so none starts last; the file names every test module and no
module that is gone (scripts/refresh_module_seconds.py keeps it so); and pytest-xdist keeps that
order instead of its own (most tests first)."""
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import module_order

ROOT = Path(__file__).resolve().parents[2]


def _refresh_script():
    spec = importlib.util.spec_from_file_location("refresh_module_seconds", ROOT / "scripts" / "refresh_module_seconds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_seconds_file_names_every_test_module_and_no_other():
    recorded = set(module_order.read_module_seconds())
    existing = set(_refresh_script().test_modules())
    gone, missing = sorted(recorded - existing), sorted(existing - recorded)
    assert not gone and not missing, (
        f"tests/module_seconds.txt is stale: names modules that are gone {gone}, misses {missing}: run them "
        "(or the suite), then `.venv/bin/python scripts/refresh_module_seconds.py` and commit the file")


def test_started_first_is_the_file_longest_first():
    seconds = module_order.read_module_seconds()
    assert set(module_order.STARTED_FIRST) == set(seconds)
    times = [seconds[m] for m in module_order.STARTED_FIRST]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def test_longest_first_unknown_before_them_each_module_whole_in_order():
    seconds = {"tests/a/test_x.py": 1.0, "tests/s.py": 30.0, "tests/f.py": 90.0, "tests/b/test_y.py": 2.0}
    ids = ["tests/a/test_x.py::t1", "tests/s.py::s1", "tests/a/test_x.py::t2", "tests/new.py::n1", "tests/f.py::f1",
           "tests/s.py::s2", "tests/b/test_y.py::t", "tests/new2.py::m", "tests/new.py::n2"]
    items = [_Item(i) for i in ids]
    module_order.longest_modules_first(items, seconds)
    assert [i.nodeid for i in items] == ["tests/new.py::n1", "tests/new.py::n2", "tests/new2.py::m", "tests/f.py::f1",
                                         "tests/s.py::s1", "tests/s.py::s2", "tests/b/test_y.py::t",
                                         "tests/a/test_x.py::t1", "tests/a/test_x.py::t2"]


def test_refresh_merges_measured_times_and_drops_gone_modules():
    merged = _refresh_script().merged({"a": 1.0, "gone": 5.0, "b": 2.0}, {"b": 7.5, "c": 3.0}, {"a", "b", "c"})
    assert merged == {"a": 1.0, "b": 7.5, "c": 3.0}


def test_a_run_writes_its_modules_seconds(tmp_path):
    clock = module_order.ModuleClock()

    class Report:
        def __init__(self, nodeid, duration):
            self.nodeid, self.duration = nodeid, duration
    for nodeid, d in (("tests/p.py::a", 0.5), ("tests/p.py::a", 2.0), ("tests/q.py::b[1]", 3.0)):
        clock.add(Report(nodeid, d))
    clock.write(tmp_path / "s.txt")
    assert module_order.read_module_seconds(tmp_path / "s.txt") == {"tests/p.py": 2.5, "tests/q.py": 3.0}


def test_xdist_workers_take_modules_in_this_order(tmp_path):
    """Three modules in two workers under --dist loadfile: pytest-xdist's default would hand out the
    one with the most tests (many) first; the recorded seconds say long, then mid."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import module_order
        SECONDS = {{"test_long.py": 9.0, "test_mid.py": 5.0, "test_many.py": 1.0}}
        def pytest_configure(config):
            module_order.keep_collection_order(config)
        def pytest_collection_modifyitems(items):
            module_order.longest_modules_first(items, SECONDS)
        def pytest_runtest_setup(item):
            with open(os.path.join({str(tmp_path)!r}, os.environ["PYTEST_XDIST_WORKER"] + ".log"), "a") as f:
                f.write(item.nodeid.split("::")[0] + "\\n")
        """))
    (tmp_path / "test_many.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(5)))
    (tmp_path / "test_mid.py").write_text("def test_a():\n    pass\ndef test_b():\n    pass\n")
    (tmp_path / "test_long.py").write_text("def test_a():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # (this run may be a worker)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider",
                          "-p", "no:randomly", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    firsts = {(tmp_path / f"gw{w}.log").read_text().split()[0] for w in (0, 1)}
    assert firsts == {"test_long.py", "test_mid.py"}, firsts
