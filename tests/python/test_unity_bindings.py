"""CI's unity build of the core's pybind11 files (COMMLIB_UNITY_BINDINGS, set by .ci/run): which files
the generated groups hold (build_deps.unity_groups), and that setup.py groups them only when asked."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from build_deps import unity_groups  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _age(path, seconds):
    t = path.stat().st_mtime - seconds
    os.utime(path, (t, t))


def test_unity_groups_hold_every_bindings_file_once_balanced_by_bytes(tmp_path):
    """COMMLIB_UNITY_BINDINGS (CI): csrc/bindings' files become a few generated files that include
    them; every other source stays; each member is in exactly one group, the groups balanced by bytes
    (largest first to the lightest group); a group's file keeps its age while its list is the same,
    and is rewritten when a member is added."""
    (tmp_path / "csrc" / "bindings").mkdir(parents=True)
    (tmp_path / "csrc" / "host").mkdir()
    sizes = {"a": 900, "b": 500, "c": 400, "d": 300, "e": 100}
    for name, n in sizes.items():
        (tmp_path / "csrc" / "bindings" / f"{name}.cc").write_text("x" * n)
    (tmp_path / "csrc" / "host" / "h.cc").write_text("int h;\n")
    sources = ["csrc/host/h.cc"] + [f"csrc/bindings/{n}.cc" for n in sizes]
    obj = tmp_path / "build" / "obj"
    out, made = unity_groups(sources, tmp_path, obj, 2)
    assert out == ["csrc/host/h.cc", "build/obj/unity_bindings_0.cc", "build/obj/unity_bindings_1.cc"]
    # a 900 -> 0; b 500 -> 1; c 400 -> 1 (900); d 300 -> 0 (the first of equals); e 100 -> 1 (1000 < 1200)
    assert made == {"build/obj/unity_bindings_0.cc": ["csrc/bindings/a.cc", "csrc/bindings/d.cc"],
                    "build/obj/unity_bindings_1.cc": ["csrc/bindings/b.cc", "csrc/bindings/c.cc", "csrc/bindings/e.cc"]}
    text = (obj / "unity_bindings_1.cc").read_text()
    assert '#include "bindings/b.cc"\n#include "bindings/c.cc"\n#include "bindings/e.cc"\n' in text
    _age(obj / "unity_bindings_0.cc", 50)
    _age(obj / "unity_bindings_1.cc", 50)
    ages = [(obj / f"unity_bindings_{i}.cc").stat().st_mtime for i in (0, 1)]
    assert unity_groups(sources, tmp_path, obj, 2) == (out, made)
    assert [(obj / f"unity_bindings_{i}.cc").stat().st_mtime for i in (0, 1)] == ages  # same lists: untouched
    (tmp_path / "csrc" / "bindings" / "f.cc").write_text("x" * 50)
    _, more = unity_groups(sources + ["csrc/bindings/f.cc"], tmp_path, obj, 2)
    assert sorted(m for g in more.values() for m in g) == sorted(f"csrc/bindings/{n}.cc" for n in "abcdef")
    assert [(obj / f"unity_bindings_{i}.cc").stat().st_mtime for i in (0, 1)] != ages
    assert unity_groups(["csrc/host/h.cc"], tmp_path, obj, 2) == (["csrc/host/h.cc"], {})


def test_setup_groups_the_bindings_only_when_asked():
    text = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert 'UNITY_BINDINGS = bool(os.environ.get("COMMLIB_UNITY_BINDINGS"))' in text
    assert 'if UNITY_BINDINGS and "commlib._C" in sources_of:' in text
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "export COMMLIB_UNITY_BINDINGS=" in ci
