"""The import graph of chopper, agent and aggregator, read from the source (nothing is imported).

Rules: the two daemons are peers (``agent`` and ``aggregator`` never import each other); ``chopper``
never imports a daemon, but for the exceptions listed in ``CHOPPER_USES_DAEMONS``; and no module
imports itself through others (no cycles). Every import counts wherever it stands (module level or
in a function: a lazy import still runs), except under ``if TYPE_CHECKING:``, which never runs.
An import of ``a.b.c`` counts as importing ``a.b.c`` only: the package ``__init__``s it runs first
are not counted, or every package that imports its own submodules would be a cycle.
``from pkg import name`` imports ``pkg.name`` where that is a module, else ``pkg``; relative imports
are resolved against the importing module's package.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chopper", "agent", "aggregator")

# chopper modules that may import a daemon, each with the reason.
CHOPPER_USES_DAEMONS = {
    "chopper.demo.run": "the demo starts both daemons in process and reads the GPU specs of the agent's backends",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in (child, *_runtime_nodes(child)))
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports, by the rules of the module docstring."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            full = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            targets = [f if f in known else base for f in full]
        else:
            continue
        for target in targets:
            # `import a.b.c` of a name that is not a module (an attribute): the nearest module above it.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def top(module: str) -> str:
    return module.partition(".")[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a cycle through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [path_through(edges, set(c)) for c in components]


def path_through(edges: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle inside ``component``, from its first module back to it: what a reader needs to break it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def test_the_graph_is_read_from_every_module() -> None:
    edges = graph()
    assert {"chopper", "agent.metrics", "aggregator.metrics", "chopper.daemon.exposition"} <= set(edges)
    assert "chopper.daemon.exposition" in edges["agent.metrics"] and "agent.catalog" in edges["agent.metrics"]


def test_the_daemons_are_peers() -> None:
    edges = graph()
    crossing = sorted(f"{a} imports {b}" for a, targets in edges.items() for b in targets
                      if {top(a), top(b)} == {"agent", "aggregator"})
    assert not crossing, "agent and aggregator import only chopper and themselves:\n" + "\n".join(crossing)


def test_chopper_imports_no_daemon_but_the_listed_exceptions() -> None:
    edges = graph()
    uses = {a: sorted(b for b in targets if top(b) in ("agent", "aggregator"))
            for a, targets in edges.items() if top(a) == "chopper"}
    unlisted = sorted(f"{a} imports {', '.join(b)}" for a, b in uses.items() if b and a not in CHOPPER_USES_DAEMONS)
    assert not unlisted, "chopper serves trainers and both daemons; it imports neither:\n" + "\n".join(unlisted)
    assert all(uses.get(a) for a in CHOPPER_USES_DAEMONS), "an exception that is no longer used: remove it"


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert not found, "import cycles (each line: a module, what it imports, ..., back to the first):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_cycles_are_found_and_explained() -> None:
    edges = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a", "p.d"}, "p.d": set()}
    assert cycles(edges) == [["p.a", "p.b", "p.c", "p.a"]]


def test_imports_resolve_relative_lazy_and_from_imports(tmp_path: Path) -> None:
    known = {name: tmp_path for name in ("p", "p.s", "p.s.a", "p.s.b", "p.c", "p.d", "p.e")}
    source = tmp_path / "a.py"
    source.write_text("from . import b\nfrom p.s import a, CONSTANT\nif TYPE_CHECKING:\n    import p.c\n\n"
                      "def f():\n    import p.d.attr\n    from .. import e\n")
    # Self import dropped; `from p.s import CONSTANT` is p.s; TYPE_CHECKING ignored; the lazy ones count.
    assert imports("p.s.a", source, known) == {"p.s", "p.s.b", "p.d", "p.e"}
