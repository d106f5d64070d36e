"""The house holds: layers point one way, no import circles, private modules stay private.

Layers, lowest first: ``blackboard`` < ``pipelets`` < ``engine`` < the
listener/router core < its features (plug-ins) < the CLI and the package's
public face.  Every import counts: at the top, under ``if TYPE_CHECKING:``
and inside functions.  A package's private modules (``_name``) are used
only inside that package; other packages use what it lists in ``__all__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("blackboard", "pipelets", "engine", "listener_router")
FEATURES = ("events", "jobs", "schedules", "journal", "dead_letters", "watch", "reprocess",
            "delta")
TOP = ("listener_router", "listener_router.__main__")   # the public face, with the CLI


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Modules of the four packages ``name`` imports, with the line of each import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.append((target, node.lineno))
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    """0 blackboard, 1 pipelets, 2 engine, 3 core, 4 features, 5 CLI and public face."""
    top, _, rest = name.partition(".")
    if top != "listener_router":
        return PACKAGES.index(top)
    second = rest.partition(".")[0]
    if name in TOP or second == "cli":
        return 5
    return 4 if second in FEATURES else 3


def _where(name: str, line: int) -> str:
    return f"{MODULES[name].relative_to(REPO)}:{line}"


def test_every_module_is_in_a_layer():
    assert len(MODULES) > 100
    assert {layer(m) for m in MODULES} == {0, 1, 2, 3, 4, 5}


def test_no_module_imports_a_higher_layer():
    upward = [f"{_where(name, line)}: {name} (layer {layer(name)}) imports {target} "
              f"(layer {layer(target)})"
              for name, imports in GRAPH.items() for target, line in imports
              if layer(target) > layer(name)]
    assert upward == []


def test_there_is_no_import_circle():
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    graph.add_edges_from((name, target) for name, imports in GRAPH.items()
                         for target, _line in imports)
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert circles == []


def _owner(private: str) -> str:
    """The package a private module belongs to (``a.b._c`` → ``a.b``)."""
    parts = private.split(".")
    index = next(i for i, p in enumerate(parts) if p.startswith("_"))
    return ".".join(parts[:index])


def test_private_modules_are_used_only_inside_their_package():
    strangers = [f"{_where(name, line)}: {name} imports {target}, private to {_owner(target)}"
                 for name, imports in GRAPH.items() for target, line in imports
                 if any(p.startswith("_") for p in target.split("."))
                 and not (name == _owner(target) or name.startswith(_owner(target) + "."))]
    assert strangers == []


@pytest.mark.parametrize("package", ["listener_router"])
def test_no_module_of_the_listener_router_is_over_500_lines(package):
    long = [f"{path.relative_to(REPO)}: {n} lines" for name, path in MODULES.items()
            if name.startswith(package)
            and (n := len(path.read_text(encoding="utf-8").splitlines())) > 500]
    assert long == []


def test_the_core_names_no_feature():
    """Not even in a string: the core finds features through their entry points only."""
    named = [f"{MODULES[name].relative_to(REPO)}: names listener_router.{feature}"
             for name in MODULES if layer(name) == 3
             for feature in FEATURES
             if f"listener_router.{feature}" in MODULES[name].read_text(encoding="utf-8")]
    assert named == []
