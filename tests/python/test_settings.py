"""One settings table (csrc/common/params.cc): every COMMLIB_* variable is declared there once,
read only through it, and README's "Settings" table mirrors it."""
import ast
import os
import re

import pytest

from commlib import settings
import commlib._C as _C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_settings():
    """{name: (type, default)} from README's settings table (rows starting with | `COMMLIB_)."""
    rows = {}
    for line in open(os.path.join(ROOT, "README.md")):
        m = re.match(r"\|\s*`(COMMLIB_[A-Z0-9_<>]+)`\s*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3).strip("`") if m.group(3) != "unset" else "")
    return rows


def test_readme_mirrors_the_table():
    table = {p["name"]: (p["type"], p["default"]) for p in settings.table()}
    assert "COMMLIB_TIMEOUT" in table and table["COMMLIB_TIMEOUT"] == ("seconds", "300")
    assert readme_settings() == table, "README's Settings table and csrc/common/params.cc disagree"


def test_no_setting_is_read_around_the_table():
    # C++: the one getenv is params.cc's.
    offenders = []
    for d, _, files in os.walk(os.path.join(ROOT, "csrc")):
        for f in files:
            path = os.path.join(d, f)
            if f.endswith((".cc", ".h", ".cu", ".cuh")) and not path.endswith(os.path.join("common", "params.cc")):
                for i, line in enumerate(open(path), 1):
                    if re.search(r"\bgetenv\s*\(", line) and not line.lstrip().startswith("//"):
                        offenders.append(f"{os.path.relpath(path, ROOT)}:{i}")
    # Python: no os.environ / os.getenv read of a COMMLIB_ name (a literal or a module constant).
    for d, _, files in os.walk(os.path.join(ROOT, "commlib")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                offenders += [f"{os.path.relpath(path, ROOT)}:{n}" for n in _python_env_reads(path)]
    assert not offenders, ("COMMLIB_* read outside the settings table (declare it in csrc/common/params.cc and "
                           "read it with commlib.settings / param_*):\n" + "\n".join(offenders))


def _python_env_reads(path):
    tree = ast.parse(open(path).read(), path)
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}

    def commlib_name(node):
        v = node.value if isinstance(node, ast.Constant) else consts.get(getattr(node, "id", None))
        return isinstance(v, str) and v.startswith("COMMLIB_")

    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and commlib_name(node.args[0]):
            fn = node.func
            if (isinstance(fn, ast.Attribute) and fn.attr in ("get", "pop", "setdefault") and is_environ(fn.value)) \
                    or (isinstance(fn, ast.Attribute) and fn.attr == "getenv"):
                lines.append(node.lineno)
        if isinstance(node, ast.Subscript) and is_environ(node.value) and commlib_name(node.slice) \
                and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
    return lines


def test_the_scanner_sees_direct_reads(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('import os\nNAME = "COMMLIB_X"\na = os.environ.get("COMMLIB_Y")\nb = os.environ[NAME]\n'
                 'c = os.getenv(NAME, "")\nos.environ["COMMLIB_Z"] = "1"\nd = os.environ.get("HOME")\n')
    assert _python_env_reads(str(f)) == [3, 4, 5]


def test_settings_read_the_environment_with_defaults(monkeypatch):
    monkeypatch.delenv("COMMLIB_SHM_SLOTS", raising=False)
    assert settings.get("COMMLIB_SHM_SLOTS") == "4"
    monkeypatch.setenv("COMMLIB_SHM_SLOTS", "8")
    assert settings.get("COMMLIB_SHM_SLOTS") == "8"
    monkeypatch.setenv("COMMLIB_ALGO_BROADCAST", "pipeline")  # a family member
    assert settings.get("COMMLIB_ALGO_BROADCAST") == "pipeline"
    monkeypatch.setenv("COMMLIB_TIMEOUT", "-3")
    with pytest.raises(ValueError, match="^COMMLIB_TIMEOUT"):
        settings.get_seconds("COMMLIB_TIMEOUT")
    with pytest.raises(RuntimeError, match="COMMLIB_NOT_A_SETTING is not declared"):
        _C.setting("COMMLIB_NOT_A_SETTING")


def test_no_document_links_outside_the_repository():
    # A clone has only the repository: a link like ../shared/DESIGN.md is dead there.
    link = re.compile(r"\]\(([^)#\s]+)")
    bad = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in ("build", "report", "node_modules")]
        for f in files:
            if f.endswith(".md"):
                path = os.path.join(d, f)
                for target in link.findall(open(path, encoding="utf-8").read()):
                    if "://" in target or target.startswith("mailto:"):
                        continue
                    full = os.path.normpath(os.path.join(d, target))
                    if not full.startswith(ROOT + os.sep):
                        bad.append(f"{os.path.relpath(path, ROOT)}: {target}")
    assert not bad, "links leaving the repository:\n" + "\n".join(bad)


def test_integer_settings_are_range_checked_where_declared(monkeypatch):
    """Every int/bytes row declares its range in params.cc, and reading it checks that range
    (a reader need not repeat it: shm.cc reads COMMLIB_SHM_SLOTS without one)."""
    rows = {p["name"]: p for p in settings.table()}
    for name, p in rows.items():
        assert (p["range"] is not None) == (p["type"] in ("int", "bytes")), name
    assert rows["COMMLIB_SHM_SLOTS"]["range"] == (2, 64)
    assert rows["COMMLIB_DEVICE_STREAMS"]["range"] == (1, 2)
    monkeypatch.setenv("COMMLIB_SHM_SLOTS", "64")
    assert settings.get_int("COMMLIB_SHM_SLOTS") == 64
    monkeypatch.setenv("COMMLIB_SHM_SLOTS", "65")
    with pytest.raises(ValueError, match=r"^COMMLIB_SHM_SLOTS: must be in 2\.\.64, got 65"):
        settings.get_int("COMMLIB_SHM_SLOTS")
    monkeypatch.setenv("COMMLIB_TCP_CHUNK_BYTES", "1024")
    with pytest.raises(ValueError, match="^COMMLIB_TCP_CHUNK_BYTES: must be in 4096"):
        settings.get_int("COMMLIB_TCP_CHUNK_BYTES")
    monkeypatch.setenv("COMMLIB_SPIN_US", "-2")
    with pytest.raises(ValueError, match="^COMMLIB_SPIN_US"):
        settings.get_int("COMMLIB_SPIN_US")
    with pytest.raises(RuntimeError, match="COMMLIB_TUNING.*not int or bytes"):
        settings.get_int("COMMLIB_TUNING")


def test_byte_settings_take_binary_suffixes(monkeypatch):
    """A bytes setting is digits with an optional K, M or G (1024-based, either case), read the same
    by param_int and param_bytes (parse_byte_count); anything else is refused naming the variable."""
    accepted = {"0": 0, "65536": 65536, "64K": 64 << 10, "64k": 64 << 10, "4M": 4 << 20, "1G": 1 << 30,
                "8589934591G": 8589934591 << 30}  # the largest count of G that fits in int64
    for value, expected in accepted.items():
        monkeypatch.setenv("COMMLIB_STREAM_BYTES", value)
        assert settings.get_int("COMMLIB_STREAM_BYTES") == expected, value
    # The suffix applies before the declared range is checked: 4K is in 4096..64 MiB, 65M is not.
    monkeypatch.setenv("COMMLIB_TCP_CHUNK_BYTES", "4K")
    assert settings.get_int("COMMLIB_TCP_CHUNK_BYTES") == 4096
    monkeypatch.setenv("COMMLIB_TCP_CHUNK_BYTES", "65M")
    with pytest.raises(ValueError, match=r"^COMMLIB_TCP_CHUNK_BYTES: must be in 4096\.\.67108864, got 65M$"):
        settings.get_int("COMMLIB_TCP_CHUNK_BYTES")
    refused = ["lots", "-1", "+5", " 5", "5 ", "0x10", "64KB", "64KiB", "4T", "1.5M", "K", "64KK",
               "8589934592G", "99999999999999999999"]
    for value in refused:
        monkeypatch.setenv("COMMLIB_STREAM_BYTES", value)
        with pytest.raises(ValueError) as e:
            settings.get_int("COMMLIB_STREAM_BYTES")
        assert str(e.value) == ("COMMLIB_STREAM_BYTES: expected a byte count >= 0 (digits, optionally followed "
                                f"by K, M or G: 1024-based), got '{value}'"), value


def test_integer_settings_refuse_a_value_past_int64(monkeypatch):
    monkeypatch.setenv("COMMLIB_SHM_SLOTS", "99999999999999999999")
    with pytest.raises(ValueError, match="^COMMLIB_SHM_SLOTS: expected an integer"):
        settings.get_int("COMMLIB_SHM_SLOTS")


SOCKET_FAMILIES = ("AF_INET", "AF_INET6", "ipv4", "ipv6", "4", "6")  # csrc/transport/tcp/tcp_socket.cc


def test_enumerated_settings_refuse_a_bad_value_alike(monkeypatch):
    """param_choice (params.cc): every "name" setting read as one of a list refuses another value
    with one message naming the setting, its value and the choices, in Python as in C++."""
    import commlib._C as _C
    cases = [("COMMLIB_DEVICE_PATH", settings.DEVICE_PATHS), ("COMMLIB_DEVICE_LINK", settings.DEVICE_LINKS),
             ("COMMLIB_SOCKET_FAMILY", SOCKET_FAMILIES)]
    for name, allowed in cases:
        monkeypatch.setenv(name, "bogus")
        with pytest.raises(ValueError) as e:
            settings.get_choice(name, allowed)
        assert str(e.value) == f"{name}: expected one of {', '.join(allowed)}, got 'bogus'"
    # The core's own reader of COMMLIB_DEVICE_LINK (the engine's is the same function).
    with pytest.raises(ValueError) as e:
        _C.device_links([0, 0], 0, "bogus")
    assert str(e.value) == "COMMLIB_DEVICE_LINK: expected one of auto, ipc, nccl, got 'bogus'"
    # Blanks and case are ignored, the spelling returned is the list's; unset is the default.
    monkeypatch.setenv("COMMLIB_DEVICE_PATH", " Kernel ")
    assert settings.get_choice("COMMLIB_DEVICE_PATH", settings.DEVICE_PATHS) == "kernel"
    monkeypatch.setenv("COMMLIB_SOCKET_FAMILY", "af_inet6")
    assert settings.get_choice("COMMLIB_SOCKET_FAMILY", SOCKET_FAMILIES) == "AF_INET6"
    for name, _ in cases:
        monkeypatch.delenv(name)
    assert settings.get_choice("COMMLIB_DEVICE_LINK", settings.DEVICE_LINKS) == "auto"
    assert settings.get_choice("COMMLIB_SOCKET_FAMILY", SOCKET_FAMILIES) == ""  # no default: unset
    with pytest.raises(RuntimeError, match="COMMLIB_SHM_SLOTS is not a name setting"):
        settings.get_choice("COMMLIB_SHM_SLOTS", ["4"])
