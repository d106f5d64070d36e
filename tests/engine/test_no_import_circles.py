"""Imports among blackboard, pipelets and engine: no circle, and only downward.

Every ``import`` counts, wherever it stands: at the top, under ``if
TYPE_CHECKING:``, inside a function.  ``from package import name`` of a name
that is not a module is an edge to the package, whose ``__init__`` imports
its modules: a module that imports its own package's re-exports is a circle.
Layers: blackboard < pipelets < engine (< listener_router); a module imports
from its own layer or those below.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import networkx as nx
from engine_helpers import REPO

LAYERS = ("blackboard", "pipelets", "engine", "listener_router")
CHECKED = LAYERS[:3]


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement in module ``name`` (file ``path``) reaches."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join([*here, *([node.module] if node.module else [])])
    # ``from pkg import mod`` reaches the module; ``from pkg import Name`` the package
    return [f"{base}.{alias.name}" for alias in node.names] or [base]


def import_graph(root: Path, packages: tuple[str, ...]) -> nx.DiGraph:
    """Modules of ``packages`` as nodes; an edge per importing module and module it reaches
    (edge attribute ``at``: ``file:line`` of the first such import)."""
    files = module_files(root, packages)
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imported(name, path, node):
                top = target.split(".")[0]
                if top not in LAYERS:
                    continue
                if top not in packages:  # not read here: which names are modules is unknown
                    target = node.module or target if isinstance(node, ast.ImportFrom) else target
                while target not in files and "." in target and top in packages:
                    target = target.rpartition(".")[0]  # a name in a module: the module
                if target == name:
                    continue
                if not graph.has_edge(name, target):
                    graph.add_edge(name, target, at=f"{path.relative_to(root)}:{node.lineno}")
    return graph


def circles(graph: nx.DiGraph) -> list[str]:
    """One circle per set of modules that import each other, as
    ``a (file:line) -> b (file:line) -> a`` (and the other modules of the set)."""
    out = []
    for part in nx.strongly_connected_components(graph):
        if len(part) < 2:
            continue
        cycle = nx.find_cycle(graph.subgraph(part))
        text = " -> ".join(f"{a} ({graph.edges[a, b]['at']})" for a, b in cycle) + f" -> {cycle[0][0]}"
        others = sorted(part - {a for a, _ in cycle})
        out.append(text + (f" (with {', '.join(others)})" if others else ""))
    return sorted(out)


def upward(graph: nx.DiGraph) -> list[str]:
    """Imports of a higher layer, as ``file:line: a imports b``."""
    rank = {layer: n for n, layer in enumerate(LAYERS)}
    return sorted(f"{at}: {a} imports {b}" for a, b, at in graph.edges(data="at")
                  if rank[b.split(".")[0]] > rank[a.split(".")[0]])


def test_no_module_of_blackboard_pipelets_or_engine_imports_its_way_back_to_itself() -> None:
    found = circles(import_graph(REPO, CHECKED))
    assert found == [], "import circles (break each: move what both need to a module below them):\n" + \
        "\n".join(found)


def test_blackboard_imports_neither_pipelets_nor_engine_and_pipelets_not_engine() -> None:
    found = upward(import_graph(REPO, CHECKED))
    assert found == [], "imports of a higher layer (blackboard < pipelets < engine):\n" + "\n".join(found)


def test_every_module_is_read() -> None:
    graph = import_graph(REPO, CHECKED)
    assert {"blackboard._blackboard", "pipelets._base", "engine._interpreter", "engine"} <= set(graph)
    assert graph.has_edge("engine._worker", "blackboard")  # an import inside a function
    assert graph.has_edge("engine", "engine._runner")  # a package's re-export


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_imports_under_type_checking_and_inside_functions_make_circles(tmp_path: Path) -> None:
    write(tmp_path, {
        "engine/__init__.py": "from engine._a import A\nfrom engine._c import C\n",
        "engine/_a.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from engine._b import B
            class A: ...
            """,
        "engine/_b.py": """
            def f():
                from engine import _a
            """,
        "engine/_c.py": "from engine import A\nclass C: ...\n",
    })
    found = circles(import_graph(tmp_path, ("engine",)))
    assert len(found) == 2
    assert "engine._a (engine/_a.py:4) -> engine._b (engine/_b.py:3) -> engine._a" in "\n".join(found) or \
        "engine._b (engine/_b.py:3) -> engine._a (engine/_a.py:4) -> engine._b" in "\n".join(found)
    assert any("engine._c (engine/_c.py:1)" in line and "engine (engine/__init__.py:2)" in line
               for line in found)  # a re-export of the module's own package


def test_an_import_of_a_higher_layer_is_reported_with_its_place(tmp_path: Path) -> None:
    write(tmp_path, {
        "blackboard/__init__.py": "",
        "blackboard/_x.py": "def f():\n    import pipelets.text\n",
        "pipelets/__init__.py": "",
        "pipelets/text.py": "from blackboard import _x\nfrom engine._runner import R\n",
    })
    found = upward(import_graph(tmp_path, ("blackboard", "pipelets")))
    assert found == ["blackboard/_x.py:2: blackboard._x imports pipelets.text",
                     "pipelets/text.py:2: pipelets.text imports engine._runner"]
