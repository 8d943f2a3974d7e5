"""CI's unity build of the core's pybind11 files and the torch backend's (COMMLIB_UNITY_BINDINGS, set by
.ci/run): which files the generated groups hold (build_deps.unity_groups), that setup.py groups them only
when asked, and that no two files of either folder define one name in an anonymous namespace (they
would clash, or overload each other, in whichever group holds both)."""
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from build_deps import unity_groups  # noqa: E402

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


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


def test_torch_backend_groups_by_folder_and_stem(tmp_path):
    """The torch backend's files are grouped as the bindings are, under their own stem: another folder's
    files (and a file whose name only starts like the folder's) stay as they are."""
    for d in ("csrc/torch_backend", "csrc/torch_backend_extra", "csrc/bindings"):
        (tmp_path / d).mkdir(parents=True)
    sources = ["csrc/bindings/a.cc", "csrc/torch_backend/x.cc", "csrc/torch_backend/y.cc", "csrc/torch_backend_extra/z.cc"]
    for s in sources:
        (tmp_path / s).write_text("int v;\n" * 10)
    out, made = unity_groups(sources, tmp_path, tmp_path / "obj", 3, "csrc/torch_backend", "unity_torch_backend")
    assert out == ["csrc/bindings/a.cc", "csrc/torch_backend_extra/z.cc", "obj/unity_torch_backend_0.cc",
                   "obj/unity_torch_backend_1.cc"]
    assert made == {"obj/unity_torch_backend_0.cc": ["csrc/torch_backend/x.cc"],
                    "obj/unity_torch_backend_1.cc": ["csrc/torch_backend/y.cc"]}
    assert '#include "torch_backend/y.cc"\n' in (tmp_path / "obj" / "unity_torch_backend_1.cc").read_text()


def test_setup_groups_the_bindings_only_when_asked():
    text = (ROOT / "setup.py").read_text()
    assert 'UNITY_BINDINGS = bool(os.environ.get("COMMLIB_UNITY_BINDINGS"))' in text
    assert 'if UNITY_BINDINGS and name in sources_of:' in text
    assert '"commlib._C": ("csrc/bindings", "unity_bindings", 4)' in text
    assert '"commlib._C_torch": ("csrc/torch_backend", "unity_torch_backend", 3)' in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "export COMMLIB_UNITY_BINDINGS=" in ci


def test_ci_compiles_the_glue_at_o1_and_the_unity_torch_files_without_the_pch():
    """COMMLIB_BINDINGS_O1 (CI): the pybind11 files and the torch backend's get -O1 after the -O3 of
    their flags (the later -O wins); as unity files the torch backend's take no precompiled header
    (building it cost more than it saved three files)."""
    text = (ROOT / "setup.py").read_text()
    assert 'BINDINGS_O1 = bool(os.environ.get("COMMLIB_BINDINGS_O1"))' in text
    assert 'GLUE_FOLDERS = ("csrc/bindings", "csrc/torch_backend")' in text
    assert "TORCH_PCH = not UNITY_BINDINGS" in text
    assert "export COMMLIB_BINDINGS_O1=" in (ROOT / ".ci" / "run").read_text()
    if not (os.environ.get("COMMLIB_BINDINGS_O1") and os.environ.get("COMMLIB_UNITY_BINDINGS")):
        return  # (this tree's build: the README's, -O3 throughout)
    # CI's tree (scripts/test.sh built it with these settings): the compile lines its build recorded
    obj = ROOT / "build" / "obj"
    glue = sorted(obj.glob("build_obj_unity_*.cmd"))
    assert len(glue) == 7, [p.name for p in glue]  # 4 bindings files, 3 torch backend files
    for cmd in glue:
        flags = cmd.read_text().split()
        assert [f for f in flags if f.startswith("-O")][-1] == "-O1", cmd.name
        assert "-include" not in flags, cmd.name
    core = (obj / next(p.name for p in obj.glob("csrc_host_communicator.cc.*.cmd"))).read_text().split()
    assert [f for f in core if f.startswith("-O")] == ["-O3"]


def internal_names(text):
    """The names a C++ file defines at the top of its anonymous namespaces (`namespace {` ... `}`):
    functions, classes and variables; a function's body and a class's members are not read."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    names, inside, depth, stmt = set(), False, 0, ""
    for line in text.splitlines():
        line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line).split("//")[0]
        line = re.sub(r"'(?:\\.|[^'\\])+'", "''", line)
        if not inside:
            inside, depth, stmt = bool(re.match(r"\s*namespace\s*\{", line)), 0, ""
            continue
        for ch in line + "\n":
            if depth == 0:
                if ch == "}":  # the namespace's end
                    inside = False
                    break
                stmt += ch
                if ch in "{;":  # a declaration's end or a body's start
                    m = (re.search(r"\b(?:class|struct|enum(?:\s+class)?|union)\s+(\w+)", stmt)
                         or re.search(r"(\w+)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*(?:const\s*)?(?:noexcept\s*)?"
                                      r"(?:->[^{;]*)?[{;]\s*$", stmt)
                         or re.search(r"(\w+)\s*(?:\[[^\]]*\])?\s*(?:=[^;]*|\{[^;]*)?[;{]\s*$", stmt))
                    if m and not re.match(r"\s*(using|namespace|typedef)\b", stmt):
                        names.add(m.group(1))
                    stmt = ""
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    stmt = ""
    return names


def test_the_scan_reads_what_a_file_defines():
    text = """namespace a {
namespace {
// a comment's apostrophe: it's
const char* kName = "}{";
struct Held { int f() { return 1; } };
int helper(const std::vector<int>& v, int (*g)(int)) {
  if (v.empty()) { return '}'; }
  return 0;
}
bool declared(int x);
}  // namespace
int outside(int x) { return x; }
}  // namespace a
"""
    assert internal_names(text) == {"kName", "Held", "helper", "declared"}


@pytest.mark.parametrize("folder", ["csrc/bindings", "csrc/torch_backend"])
def test_no_two_files_of_a_unity_folder_define_one_internal_name(folder):
    """Each of the folder's files compiles alone in the README's set-up and in a unity file beside any
    others in CI's: a helper two files define in their anonymous namespaces would clash there (or,
    with other parameters, overload the other file's), whichever group the pair falls in. Such a
    helper goes to a header (csrc/torch_backend/tensor_for_core.h)."""
    where = defaultdict(list)
    files = sorted((ROOT / folder).glob("*.cc"))
    assert len(files) > 10
    for f in files:
        for name in internal_names(f.read_text()):
            where[name].append(f.name)
    assert len(where) > 20  # (the scan finds the helpers there are)
    twice = {n: fs for n, fs in where.items() if len(fs) > 1}
    assert not twice, f"defined in the anonymous namespaces of several files of {folder}: {twice}"
