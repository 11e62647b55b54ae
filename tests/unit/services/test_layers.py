"""``imds.services`` is a stack: its packages import each other one way only, and never a layer above.

A package here is a subpackage (``services/catalog/``) or a top-level module (``services/explain.py``).
Every import is counted, at any depth (functions and ``TYPE_CHECKING`` blocks included): an import
made late to dodge a cycle is still a cycle.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import imds.services

ROOT = Path(imds.services.__file__).parent
ABOVE = ("imds.app", "imds.web", "imds.cli")  # the layers above services (cli → app → web → services → store)


def _imports(path: Path) -> list[str]:
    """Every absolute module name a file imports, ``from imds.services import x`` as ``imds.services.x``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            module = str(node.module)
            packages = {"imds", "imds.services"}  # ``from imds.services import x`` imports the module x
            names += [f"{module}.{alias.name}" for alias in node.names] if module in packages else [module]
    return names


def _package(path: Path) -> str:
    """The services package a file belongs to: its subpackage, or its own name for a top-level module."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[0]


def _graph() -> dict[str, set[str]]:
    """Package → the other services packages it imports (the package ``__init__`` assembles them all: left out)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        package = _package(path)
        if package == "__init__":
            continue
        targets = graph.setdefault(package, set())
        for name in _imports(path):
            parts = name.split(".")
            if parts[:2] == ["imds", "services"] and len(parts) > 2 and parts[2] != package:
                targets.add(parts[2])
    return graph


def test_the_scan_sees_the_packages():
    """The walk finds the packages and the arrows known to exist (a guard against scanning nothing)."""
    graph = _graph()
    assert {"catalog", "records", "render", "ganeti", "lookup", "identity", "transfer", "explain"} <= graph.keys()
    assert "catalog" in graph["records"]
    assert "records" in graph["transfer"]


def test_no_two_packages_import_each_other():
    """No pair of services packages imports the other: every arrow points one way."""
    graph = _graph()
    mutual = sorted(f"{a} <-> {b}" for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))
    assert mutual == []


def test_the_packages_form_a_stack():
    """No cycle through any number of packages either: they can be ordered bottom to top."""
    try:
        order = list(TopologicalSorter(_graph()).static_order())
    except CycleError as cycle:
        raise AssertionError(f"import cycle between services packages: {cycle.args[1]}") from None
    assert order.index("render") < order.index("catalog") < order.index("records") < order.index("transfer")


def test_services_import_no_layer_above():
    """Nothing under services imports the app, the web layer or the CLI."""
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in ROOT.rglob("*.py")
        for name in _imports(path)
        if name.startswith(tuple(f"{layer}." for layer in ABOVE)) or name in ABOVE
    )
    assert offenders == []
