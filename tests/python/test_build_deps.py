"""setup.py's object cache: an object is rebuilt exactly when a file it was built from changed."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from build_deps import depfile_inputs, object_is_current, object_name  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _age(path, seconds):
    t = path.stat().st_mtime - seconds
    os.utime(path, (t, t))


@pytest.fixture
def built(tmp_path):
    """A source including one of two headers, compiled by g++ with -MMD like setup.py does."""
    (tmp_path / "used.h").write_text("int used();\n")
    (tmp_path / "unused.h").write_text("int unused();\n")
    src = tmp_path / "a.cc"
    src.write_text('#include "used.h"\nint f() { return 1; }\n')
    obj, dep = tmp_path / "a.o", tmp_path / "a.d"
    for f in (src, tmp_path / "used.h", tmp_path / "unused.h"):
        _age(f, 100)
    subprocess.run(["g++", "-c", str(src), "-o", str(obj), "-MMD", "-MF", str(dep)], check=True)
    _age(obj, 10)  # so that a later touch() is newer even where timestamps are coarse
    return tmp_path, src, obj, dep


def test_depfile_lists_source_and_included_headers(built):
    root, src, obj, dep = built
    inputs = [Path(p).name for p in depfile_inputs(dep, obj)]
    assert inputs == ["a.cc", "used.h"]


def test_only_an_included_header_makes_the_object_stale(built):
    root, src, obj, dep = built
    newest_header = (root / "unused.h").stat().st_mtime
    assert object_is_current(obj, src, dep, newest_header)
    (root / "unused.h").touch()  # not included: stays current
    assert object_is_current(obj, src, dep, (root / "unused.h").stat().st_mtime)
    (root / "used.h").touch()
    assert not object_is_current(obj, src, dep, 0)


def test_source_change_and_missing_object_rebuild(built):
    root, src, obj, dep = built
    src.touch()
    assert not object_is_current(obj, src, dep, 0)
    obj.unlink()
    assert not object_is_current(obj, src, dep, 0)


def test_removed_header_rebuilds(built):
    root, src, obj, dep = built
    (root / "used.h").unlink()
    assert not object_is_current(obj, src, dep, 0)


def test_depfile_of_another_tree_falls_back_to_every_header(built, tmp_path_factory):
    # build/obj copied from another checkout: its dependency files name the other tree's files.
    root, src, obj, dep = built
    other = tmp_path_factory.mktemp("copy")
    obj2, dep2 = other / "a.o", other / "a.d"
    obj2.write_bytes(obj.read_bytes())
    dep2.write_text(dep.read_text())
    assert depfile_inputs(dep2, obj2) is None
    built_at = obj2.stat().st_mtime
    assert object_is_current(obj2, src, dep2, built_at - 1)
    assert not object_is_current(obj2, src, dep2, built_at + 1)


def test_no_depfile_falls_back_to_every_header(built):
    root, src, obj, dep = built
    dep.unlink()
    built_at = obj.stat().st_mtime
    assert object_is_current(obj, src, dep, built_at - 1)
    assert not object_is_current(obj, src, dep, built_at + 1)


def test_objects_of_two_pythons_have_two_names():
    # Built against 3.11's headers, an object must not be taken for 3.12's build of the same source
    # (its dependency list names 3.11's headers, which the 3.12 build never touches).
    a = object_name("csrc/host/communicator.cc", "", "cpython-311-x86_64-linux-gnu")
    b = object_name("csrc/host/communicator.cc", "", "cpython-312-x86_64-linux-gnu")
    assert a != b and a.startswith("csrc_host_communicator.cc.") and a.endswith(".o")
    assert object_name("csrc/kernels/k.cu", ".cuda", None) == "csrc_kernels_k.cu.cuda.o"  # no Python header


def test_setup_names_objects_with_the_python_abi():
    # setup.py cannot be imported (it builds): its object names are read from its text.
    text = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert 'PYTHON_ABI = sysconfig.get_config_var("SOABI")' in text
    assert 'object_name(rel, tag, None if src.endswith(".cu") else PYTHON_ABI)' in text

