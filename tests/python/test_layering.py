"""Dependencies point down: no import cycle inside commlib/, no include of engine/ from transport/.

The import graph is built from the source (ast), counting every import, including those inside
functions: a lazy import hides a cycle from Python but not from a reader. Relative imports do not
are resolved against the importing module's package.
"""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "commlib")


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
    assert "commlib.communicator" in graph and "commlib.init" in graph["commlib"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_transports_do_not_include_the_engine():
    include = re.compile(r'#\s*include\s*"([^"]+)"')
    bad = []
    tdir = os.path.join(ROOT, "csrc", "transport")
    for f in sorted(os.listdir(tdir)):
        for i, line in enumerate(open(os.path.join(tdir, f)), 1):
            m = include.match(line.strip())
            if m and m.group(1).startswith(("engine/", "bindings/")):
                bad.append(f"csrc/transport/{f}:{i}: {m.group(1)}")
    assert os.listdir(tdir) and not bad, "transport includes a higher layer:\n" + "\n".join(bad)
