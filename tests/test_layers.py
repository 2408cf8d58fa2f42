"""The import graph of src/dmrl: no cycles between modules, and no import from a lower layer to a higher one.

Layers, lowest first (DESIGN.md, "Data flows one way"); a module belongs to the layer of the longest prefix below
that names it. Every import counts (module level and inside functions) except those under ``if TYPE_CHECKING:``,
which never run. An edge ``a -> b`` is ``a`` importing module ``b`` (``from dmrl.x import y`` is an edge to
``dmrl.x.y`` when that is a module, else to ``dmrl.x``); the implicit import of a parent package is not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Lowest first. Edit here when a module moves. Prefixes match whole dotted segments ("dmrl.data" is not
#: "dmrl.database").
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("dmrl.types", "dmrl.config_utils", "dmrl._gl", "dmrl.paths")),
    # The package root registers the environments with gymnasium (``import dmrl``), so it sits with envs.
    ("envs", ("dmrl.envs", "dmrl")),
    ("data", ("dmrl.data",)),
    ("models", ("dmrl.models",)),
    ("diffusion", ("dmrl.diffusion",)),
    ("policies", ("dmrl.policies",)),
    ("algos", ("dmrl.algos",)),
    ("train", ("dmrl.train",)),
    ("export/serve", ("dmrl.export", "dmrl.serve")),
    ("cli", ("dmrl.cli", "dmrl.__main__", "dmrl.eval_command")),
]

#: Upward edges known today, each with the fix it waits for. The test fails when one of them is gone, so the list
#: only shrinks: delete the line then.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "dmrl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all but those in the body of ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_edges() -> list[tuple[str, str, str]]:
    """(importer, imported, "file:line") for every runtime import of a dmrl module by a dmrl module."""
    modules = _modules()
    edges = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(SRC.parent)}:{node.lineno}"
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from .x import y inside package p -> p.x
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                sub = [f"{base}.{a.name}" for a in node.names]
                targets = [t if t in modules else base for t in sub]
            for target in dict.fromkeys(targets):
                if target.split(".")[0] == "dmrl" and target != name:
                    assert target in modules, f"{where}: imports {target}, which is no module of src/dmrl"
                    edges.append((name, target, where))
    return edges


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise AssertionError(f"{module}: in no layer of tests/test_layers.py LAYERS; add its prefix there")
    return rank


def find_cycle(edges: list[tuple[str, str, str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search over the module graph)."""
    graph: dict[str, list[str]] = {}
    for a, b, _ in edges:
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := dfs(start)):
            return found
    return None


@pytest.fixture(scope="module")
def edges() -> list[tuple[str, str, str]]:
    return import_edges()


def test_every_module_has_a_layer():
    for module in _modules():
        layer_of(module)


def test_no_import_cycles(edges):
    cycle = find_cycle(edges)
    if cycle:
        where = {(a, b): w for a, b, w in edges}
        steps = [f"{a} -> {b} ({where[a, b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
        pytest.fail("import cycle: " + "; ".join(steps))


def test_no_upward_imports(edges):
    bad, seen = [], set()
    for a, b, where in edges:
        la, lb = layer_of(a), layer_of(b)
        if lb > la:
            seen.add((a, b))
            if (a, b) not in KNOWN_UPWARD:
                bad.append(f"{where}: {a} ({LAYERS[la][0]}) imports {b} ({LAYERS[lb][0]})")
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)
    stale = sorted(set(KNOWN_UPWARD) - seen)
    assert not stale, f"KNOWN_UPWARD lists edges that are gone: {stale}; delete them from tests/test_layers.py"


def test_graph_walker_sees_function_level_imports_and_skips_type_checking():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dmrl.cli\nelse:\n    import dmrl.types\n"
        "def f():\n    from dmrl.data import EpisodeStore\n"
    )
    names = [n.names[0].name if isinstance(n, ast.Import) else n.module for n in _runtime_imports(tree)]
    assert names == ["typing", "dmrl.types", "dmrl.data"]
