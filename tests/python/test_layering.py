"""Dependencies point down: one ranked table of floors for csrc/'s folders (FLOORS) and one for
commlib/'s packages (PY_FLOORS), and every include or import must reach a strictly lower floor: an
arrow up, or sideways between two folders of one floor, fails, naming the file and line. A folder
or package missing from its table fails too (place it before it gets arrows). A few pairs stay
apart although their floors would allow the arrow (APART: the engines don't include each other,
the verifier and the simulator no transport). Inside commlib/ no module import cycle either.

The import graph is built from the source (ast), counting every import, including those inside
functions: a lazy import hides a cycle from Python but not from a reader. Relative imports are
resolved against the importing module's package.
"""
import ast
import functools
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "commlib")
CSRC = os.path.join(ROOT, "csrc")
# The compiled extensions: leaves, not the package's face (commlib/__init__.py).
EXTENSIONS = ("commlib._C", "commlib._C_cuda", "commlib._C_torch")


def _modules(pkg=PKG):
    """{dotted module name: path} of every .py file under commlib/."""
    out = {}
    for d, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), os.path.dirname(pkg))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(d, f)
    return out


@functools.lru_cache(maxsize=None)  # every test reads the same tree: parse it once
def import_edges(pkg=PKG):
    """((module, commlib module it imports, file:line), ...). `from a import b` counts a.b when
    that is a module, else a (b is a name defined in a)."""
    mods = _modules(pkg)
    edges = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from .x import y: relative to this module's package
                    pkg_name = name if path.endswith("__init__.py") else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg_name = pkg_name.rpartition(".")[0]
                    base = f"{pkg_name}.{base}" if base else pkg_name
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                if t.startswith(EXTENSIONS):
                    continue
                while t and t not in mods:  # a.b.c where a.b is the module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.append((name, t, f"{os.path.relpath(path, ROOT)}:{node.lineno}"))
    return tuple(edges)


def import_graph():
    """{module: set of commlib modules it imports}."""
    graph = {m: set() for m in _modules()}
    for m, d, _ in import_edges():
        graph[m].add(d)
    return graph


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None. Package __init__ modules that
    import their own submodules are the normal re-export pattern and are not edges back."""
    def edges(m):
        # a submodule importing its package's __init__ executes it first anyway (Python imports
        # parents before children), so that edge is implied and cannot form a cycle of its own.
        return [d for d in graph[m] if not m.startswith(d + ".")]

    color, stack = {}, []

    def visit(m):
        color[m] = 1
        stack.append(m)
        for d in edges(m):
            if color.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in color:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        color[m] = 2
        return None

    for m in sorted(graph):
        if m not in color:
            c = visit(m)
            if c:
                return c
    return None


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert find_cycle({"p": {"p.x"}, "p.x": {"p"}}) is None  # package re-export


def test_commlib_has_no_import_cycle():
    graph = import_graph()
    assert "commlib.core.communicator" in graph and "commlib.init" in graph["commlib"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def layer_of(module):
    """commlib.core.communicator -> commlib.core; a top-level module is its own layer."""
    return ".".join(module.split(".")[:2])


_INCLUDE = re.compile(r'#\s*include\s*"([^"]+)"')


# -- the floors (docs/DESIGN.md "Layers"): lowest first; a node may use only nodes of lower floors --

# One node for every folder under csrc/transport/: a new kind of transport needs no row here.
KINDS = "transport/*"
FLOORS = (
    ("common",),
    ("transport", "schedule"),
    # the device plan lowers schedules; the cost model plays them; every kind of transport
    # (transport/<kind>/: shm, tcp, ...) implements transport/'s interface and adds a table row
    ("kernels", "sim", KINDS),
    # the policy ranks auto's candidates with the cost model; bootstrap: commlib's store from C++
    # (its signed values with transport/tcp's HMAC)
    ("device", "policy", "bootstrap"),
    ("plan", "verify"),              # plan: every engine's call -> resolved plan
    ("host", "stream", "device/emulated"),  # the engines; the emulated device only the bindings see
    ("bindings",),
    ("torch_backend",),              # commlib._C_torch: the c10d::Backend, over bindings/core_api.h
)
PY_FLOORS = (
    ("commlib.errors", "commlib.settings"),
    ("commlib.bootstrap",),
    ("commlib.device", "commlib.testing"),
    ("commlib.core",),
    ("commlib.perf", "commlib.torch", "commlib.parallel"),
    ("commlib.sim", "commlib.bench", "commlib.models"),  # bench and sim share perf, not each other
    ("commlib.init", "commlib.explain"),                 # init reads sim's topology files when asked
    ("commlib.join", "commlib.cli"),
    ("commlib.__main__",),
)
# Lower than their user, and still not to be used by it: the engines run schedules each their own
# way and share only what lies below them; the verifier and the simulator (and what they use) play
# schedules without moving a byte.
APART = {
    "host": ("verify", "sim"),
    "stream": ("verify", "sim"),
    "verify": ("sim", "transport", KINDS),
    "policy": ("transport", KINDS),
    "sim": ("transport",),
}


def floor_of(node, floors):
    for i, names in enumerate(floors):
        if node in names:
            return i
    raise KeyError(node)


def arrows_up(edges, floors, apart=None):
    """The edges [(from, to, where)] that do not reach a strictly lower floor, or reach a node kept
    apart from theirs, as messages."""
    bad = []
    for a, b, where in edges:
        fa, fb = floor_of(a, floors), floor_of(b, floors)
        if fb >= fa:
            bad.append(f"{where}: {a} (floor {fa}) uses {b} (floor {fb})")
        elif b in (apart or {}).get(a, ()):
            bad.append(f"{where}: {a} uses {b}, which it is kept apart from")
    return bad


def node_of(path, floors):
    """The table's node holding csrc-relative `path`: its longest folder in the table (KINDS for
    any folder under transport/)."""
    if path.startswith("transport/") and path.count("/") >= 2 and any(KINDS in f for f in floors):
        return KINDS
    names = sorted((n for f in floors for n in f), key=len, reverse=True)
    return next((n for n in names if path.startswith(n + "/")), None)


def include_edges(csrc=CSRC, floors=FLOORS):
    """[(node, node it includes, file:line)] for every quoted include between two of csrc's folders.
    A folder not in the table fails (place it first)."""
    edges = []
    for d, _, files in os.walk(csrc):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(d, f), csrc)
            if os.sep not in rel:
                continue
            src = node_of(rel, floors)
            assert src, f"csrc/{rel}: its folder is not in FLOORS (tests/python/test_layering.py)"
            for i, line in enumerate(open(os.path.join(d, f)), 1):
                m = _INCLUDE.match(line.strip())
                if not m or "/" not in m.group(1):
                    continue  # a file of the same folder, or a library's
                dst = node_of(m.group(1), floors)
                if dst is None:
                    assert not os.path.isdir(os.path.join(csrc, m.group(1).split("/")[0])), \
                        f"{rel}:{i}: {m.group(1)}'s folder is not in FLOORS"
                    continue
                if dst != src:
                    edges.append((src, dst, f"csrc/{rel}:{i}"))
    return edges


def package_edges(edges=None):
    """import_edges between commlib's packages (commlib.core.x -> commlib.core; the root package,
    which re-exports every layer and which nothing imports back for a name, left out)."""
    out = []
    for a, b, where in import_edges() if edges is None else edges:
        la, lb = layer_of(a), layer_of(b)
        if "commlib" not in (a, b) and la != lb:
            out.append((la, lb, where))
    return out


def test_every_folder_and_package_has_a_floor():
    folders = {n for f in FLOORS for n in f}
    on_disk = {d for d in os.listdir(CSRC) if os.path.isdir(os.path.join(CSRC, d))} | {"device/emulated", KINDS}
    assert on_disk == folders, f"csrc folders vs FLOORS: missing {on_disk - folders}, gone {folders - on_disk}"
    layers = {layer_of(m) for m in _modules()} - {"commlib"}
    placed = {n for f in PY_FLOORS for n in f}
    assert layers == placed, f"commlib packages vs PY_FLOORS: missing {layers - placed}, gone {placed - layers}"


def test_csrc_includes_point_down():
    edges = include_edges()
    assert ("sim", "schedule") in {(a, b) for a, b, _ in edges}  # the reader sees real includes
    bad = arrows_up(edges, FLOORS, APART)
    assert not bad, "an include runs up or sideways (docs/DESIGN.md, Layers):\n" + "\n".join(bad)


def test_commlib_imports_point_down():
    edges = package_edges()
    assert ("commlib.core", "commlib.bootstrap") in {(a, b) for a, b, _ in edges}
    bad = arrows_up(edges, PY_FLOORS)
    assert not bad, "an import runs up or sideways (docs/DESIGN.md, Layers):\n" + "\n".join(bad)


def test_the_explorer_sits_above_bench_and_sim():
    # commlib explain reads the simulator; bench's report gets its page writer from the command.
    used = {(a, b) for a, b, _ in package_edges()}
    assert ("commlib.explain", "commlib.sim") in used and ("commlib.explain", "commlib.bench") not in used
    assert ("commlib.sim", "commlib.perf") in used and ("commlib.bench", "commlib.perf") in used


def includes(folder, csrc=CSRC):
    """[(file:line, included path)] of every quoted include under csrc/<folder>."""
    out = []
    base = os.path.join(csrc, folder)
    for d, _, files in os.walk(base):
        for f in sorted(files):
            path = os.path.join(d, f)
            for i, line in enumerate(open(path), 1):
                m = _INCLUDE.match(line.strip())
                if m:
                    out.append((f"{os.path.relpath(path, ROOT)}:{i}", m.group(1)))
    assert out, f"no include found under csrc/{folder}"
    return out


ENGINES = ("host", "stream", "verify", "sim")


# The engines see transports as Links, the Fabric and the Transport interface: which transport
# reaches a peer is the transport table's choice (transport/registry.h). Only the host factory
# names kinds (it hands the bootstrap's material, the region and the endpoint, to the table).
def kind_of(include):
    """"shm" for "transport/shm/shm.h"; None for an include that is no kind's."""
    parts = include.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "transport" else None


def test_engines_reach_transports_only_through_the_fabric():
    allowed = {os.path.join("csrc", "host", "comm_factory.cc")}
    bad = [f"{where}: {inc}" for e in ENGINES + ("plan", "policy") for where, inc in includes(e)
           if kind_of(inc) and where.rsplit(":", 1)[0] not in allowed]
    assert not bad, "an engine names a concrete transport (use the Fabric and the table):\n" + "\n".join(bad)


def test_the_table_and_the_kinds_name_no_other_kind():
    # transport/'s own files (the interface, the table, the Fabric) name no kind: a new kind is a
    # folder and a row. A kind includes no other kind's folder (they meet only through the table).
    kinds = [d for d in os.listdir(os.path.join(CSRC, "transport")) if os.path.isdir(os.path.join(CSRC, "transport", d))]
    assert {"shm", "tcp"} <= set(kinds), kinds
    bad = []
    for where, inc in includes("transport"):
        path = where.split(":")[0].split(os.sep)  # csrc/transport/[kind/]file
        mine = path[2] if len(path) == 4 else None
        if kind_of(inc) and kind_of(inc) != mine:
            bad.append(f"{where}: {inc}")
    assert not bad, "a transport file names another kind (go through transport/registry.h):\n" + "\n".join(bad)


def test_the_floor_checks_see_an_arrow_up(tmp_path):
    # The checks above read real files; they must also catch a planted arrow: the simulator
    # including the policy (what resolving "auto" inside sim::simulate once did), an engine
    # including the emulated device, an import of the entry from the core.
    # And the transport table naming a kind (registry.cc including shm, as it once did).
    for folder in ("sim", "policy", "stream", "device/emulated", "transport/shm"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "sim" / "x.cc").write_text('#include "policy/auto_policy.h"\n#include "sim/x.h"\n')
    (tmp_path / "policy" / "y.cc").write_text('#include "sim/simulator.h"\n')
    (tmp_path / "stream" / "z.cc").write_text('#include "device/emulated/emulated_device.h"\n')
    (tmp_path / "transport" / "registry.cc").write_text('#include "transport/shm/shm.h"\n')
    (tmp_path / "transport" / "shm" / "shm.cc").write_text('#include "transport/link.h"\n')
    bad = sorted(arrows_up(include_edges(str(tmp_path), FLOORS), FLOORS, APART))
    assert len(bad) == 3 and "csrc/sim/x.cc:1: sim (floor 2) uses policy (floor 3)" in bad[0] \
        and "stream (floor 5) uses device/emulated (floor 5)" in bad[1] \
        and "csrc/transport/registry.cc:1: transport (floor 1) uses transport/* (floor 2)" in bad[2], bad
    planted = [("commlib.core.x", "commlib.init", "commlib/core/x.py:3")]
    assert arrows_up(package_edges(planted), PY_FLOORS) == \
        ["commlib/core/x.py:3: commlib.core (floor 3) uses commlib.init (floor 6)"]
    assert arrows_up([("host", "verify", "h.cc:1")], FLOORS, APART) == ["h.cc:1: host uses verify, which it is kept apart from"]


def test_the_torch_backend_reaches_the_core_only_through_its_table():
    # csrc/torch_backend (commlib._C_torch, built against torch) calls the core through the table
    # _C hands out (bindings/core_api.h): a second copy of an engine there would have its own
    # registry and settings. It may name the call types below the engines, nothing else of ours
    # (bindings/device_setup_api.h: the engine set-up's one function pointer, a table of the same kind).
    allowed = ("common/", "plan/", "torch_backend/", "bindings/core_api.h", "bindings/device_setup_api.h")
    bad = [f"{where}: {inc}" for where, inc in includes("torch_backend") if not inc.startswith(allowed)]
    assert not bad, "the torch backend includes a layer it must reach through bindings/core_api.h:\n" + "\n".join(bad)
