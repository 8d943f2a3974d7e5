"""Dependencies point down: no import cycle inside commlib/, between its subpackages either; in
csrc/, no engine folder includes another engine's, the transports include no engine, and the
verifier and the simulator include no transport header.

The import graph is built from the source (ast), counting every import, including those inside
functions: a lazy import hides a cycle from Python but not from a reader. Relative imports do not
are resolved against the importing module's package.
"""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "commlib")
CSRC = os.path.join(ROOT, "csrc")
# The compiled extensions: leaves, not the package's face (commlib/__init__.py).
EXTENSIONS = ("commlib._C", "commlib._C_cuda")


def _modules():
    """{dotted module name: path} of every .py file under commlib/."""
    out = {}
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(d, f)
    return out


def import_graph():
    """{module: set of commlib modules it imports}. `from a import b` counts a.b when that is a
    module, else a (b is a name defined in a)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from .x import y: relative to this module's package
                    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                if t.startswith(EXTENSIONS):
                    continue
                while t and t not in mods:  # a.b.c where a.b is the module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
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


def package_graph(graph):
    """{layer: layers it imports}. The root package (commlib/__init__.py) re-exports every layer
    and nothing imports it back for a name it defines, so it is left out."""
    out = {}
    for m, deps in graph.items():
        if m == "commlib":
            continue
        node = out.setdefault(layer_of(m), set())
        node.update(layer_of(d) for d in deps if d != "commlib" and layer_of(d) != layer_of(m))
    return out


def test_commlib_subpackages_have_no_cycle():
    layers = package_graph(import_graph())
    assert {"commlib.core", "commlib.device", "commlib.bootstrap", "commlib.perf", "commlib.bench",
            "commlib.sim"} <= set(layers)
    cycle = find_cycle(layers)
    assert cycle is None, "import cycle between subpackages: " + " -> ".join(cycle)


def test_bench_and_sim_share_perf_not_each_other():
    layers = package_graph(import_graph())
    assert "commlib.sim" not in layers["commlib.bench"], "bench imports sim (share it through perf)"
    assert "commlib.bench" not in layers["commlib.sim"], "sim imports bench (share it through perf)"
    assert "commlib.perf" in layers["commlib.sim"] and "commlib.perf" in layers["commlib.bench"]


def test_the_explorer_sits_above_bench_and_sim():
    # commlib explain reads the simulator; bench's report gets its page writer from the command.
    layers = package_graph(import_graph())
    assert "commlib.sim" in layers["commlib.explain"] and "commlib.bench" not in layers["commlib.explain"]
    assert "commlib.explain" not in layers["commlib.bench"] and "commlib.explain" not in layers["commlib.sim"]


_INCLUDE = re.compile(r'#\s*include\s*"([^"]+)"')


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


# One folder per engine: each runs schedules its own way and shares only what lies below them
# (common, kernels, transport, device, schedule, policy, plan). The bindings wire them together.
ENGINES = ("host", "stream", "verify", "sim")
TRANSPORT = ("transport/",)


def test_no_engine_includes_another_engine():
    bad = [f"{where}: {inc}" for e in ENGINES for where, inc in includes(e)
           if inc.split("/")[0] in ENGINES and inc.split("/")[0] != e]
    assert not bad, "an engine includes another engine's folder:\n" + "\n".join(bad)


def test_verifier_and_simulator_include_no_transport():
    bad = [f"{where}: {inc}" for folder in ("verify", "sim", "policy", "schedule")
           for where, inc in includes(folder) if inc.startswith(TRANSPORT)]
    assert not bad, "the verifier, the simulator or what they use includes a transport:\n" + "\n".join(bad)


def test_transports_do_not_include_the_engine():
    higher = tuple(f"{d}/" for d in ENGINES + ("plan", "policy", "bindings"))
    bad = [f"{where}: {inc}" for where, inc in includes("transport") if inc.startswith(higher)]
    assert not bad, "transport includes a higher layer:\n" + "\n".join(bad)


def test_engines_do_not_include_the_emulated_device():
    # A device provides its own NCCL (Device::nccl_api()): the engines pick nothing by the
    # device's name, and the emulated device and NCCL (test doubles) reach them only through the
    # device interface. The bindings create the emulated device and hold the tests' hooks.
    bad = [f"{where}: {inc}" for e in ENGINES + ("plan", "policy") for where, inc in includes(e)
           if inc.startswith("device/emulated/")]
    assert not bad, "an engine includes the emulated device or NCCL:\n" + "\n".join(bad)


# The engines see transports as Links, the Fabric and the Transport interface: which transport
# reaches a peer is the transport table's choice (transport/registry.h). Only the host factory
# names tcp (it hands the bootstrap's listening endpoint to the table).
CONCRETE_TRANSPORTS = ("transport/shm.h", "transport/tcp.h", "transport/tcp_conn.h", "transport/tcp_socket.h")


def test_engines_reach_transports_only_through_the_fabric():
    allowed = {os.path.join("csrc", "host", "comm_factory.cc")}
    bad = [f"{where}: {inc}" for e in ENGINES + ("plan", "policy") for where, inc in includes(e)
           if inc in CONCRETE_TRANSPORTS and where.rsplit(":", 1)[0] not in allowed]
    assert not bad, "an engine names a concrete transport (use the Fabric and the table):\n" + "\n".join(bad)
    fabric = [inc for where, inc in includes("transport") if os.path.basename(where).startswith("fabric.")]
    assert "transport/registry.h" in fabric and "transport/shm.h" not in fabric, \
        "the Fabric builds its domains through the transport table"


def test_the_include_checks_see_a_violation(tmp_path):
    # The checks above read real files; the reader must also see a planted include.
    (tmp_path / "stream").mkdir()
    (tmp_path / "stream" / "x.cc").write_text('#include "host/communicator.h"\n')
    [(where, inc)] = includes("stream", csrc=str(tmp_path))
    assert where.endswith("stream/x.cc:1") and inc == "host/communicator.h"


def test_the_torch_backend_reaches_the_core_only_through_its_table():
    # csrc/torch_backend (commlib._C_torch, built against torch) calls the core through the table
    # _C hands out (bindings/core_api.h): a second copy of an engine there would have its own
    # registry and settings. It may name the call types below the engines, nothing else of ours.
    allowed = ("common/", "plan/", "torch_backend/", "bindings/core_api.h")
    bad = [f"{where}: {inc}" for where, inc in includes("torch_backend") if not inc.startswith(allowed)]
    assert not bad, "the torch backend includes a layer it must reach through bindings/core_api.h:\n" + "\n".join(bad)
