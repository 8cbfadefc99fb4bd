"""The package layering the style guide asks for, checked on the source (imports only, nothing runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "appliance"


def _all_imports(path: Path) -> set[str]:
    """Every module a file imports, at any level (function-local imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _imports(path: Path) -> set[str]:
    return {name for name in _all_imports(path) if name == "appliance" or name.startswith("appliance.")}


def _modules(package: str) -> list[Path]:
    root = PACKAGE.joinpath(*package.split(".")[1:])
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def _violations(package: str, allowed: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in _modules(package)
        for name in sorted(_imports(path))
        if not any(name == a or name.startswith(a + ".") for a in allowed)
    ]


@pytest.mark.parametrize("leaf", ["appliance.core.tensors", "appliance.core.config_json", "appliance.core.errors",
                                  "appliance.core.private_files", "appliance.core.kept"])
def test_leaf_modules_import_nothing_of_the_appliance_but_its_errors(leaf):
    assert _violations(leaf, ("appliance.core.errors",)) == []


def test_backends_import_only_the_leaf_modules():
    allowed = ("appliance.backends", "appliance.core.tensors", "appliance.core.config_json", "appliance.core.errors",
               "appliance.core.kept")
    assert _violations("appliance.backends", allowed) == []


@pytest.mark.parametrize("package", ["appliance.engine", "appliance.repository", "appliance.protocol"])
def test_the_core_knows_no_front_end(package):
    for path in _modules(package):
        names = _all_imports(path)
        assert not {n for n in names if n.split(".")[0] in ("aiohttp", "grpc")}, path
        assert not {n for n in names if n.startswith(("appliance.rest", "appliance.grpc", "appliance.composition",
                                                      "appliance.commands.daemon", "appliance.cli"))}, path


def test_the_engine_knows_neither_the_repository_nor_the_protocol():
    allowed = ("appliance.engine", "appliance.backends", "appliance.core.tensors", "appliance.core.config_json",
               "appliance.core.errors", "appliance.core.private_files", "appliance.core.kept")
    assert _violations("appliance.engine", allowed) == []


def test_the_repository_knows_no_protocol():
    assert not [
        f"{path} imports {name}" for path in _modules("appliance.repository") for name in _imports(path)
        if name.startswith("appliance.protocol")
    ]


def test_the_tuning_child_and_the_selector_share_the_job_module_and_nothing_else():
    selection = PACKAGE / "selection"
    assert "appliance.selection.worker" not in _imports(selection / "selector.py")
    for module in ("job.py", "decision.py"):
        assert not {"appliance.selection.selector", "appliance.selection.worker"} & _imports(selection / module)


# -- Cycles and upward imports, counted over every module of the package -----------------------------

# Each top-level package or module of ``appliance`` and its layer: a module may import its own layer and
# those below, never one above (an upward import), and no import may close a cycle.
LAYERS: dict[str, int] = {
    # The leaves: the error hierarchy, tensor datatypes, Triton's config JSON; the process's own plumbing.
    "appliance": 0, "appliance.core": 0, "appliance.dashboard": 0, "appliance.runtime": 1,
    "appliance.backends": 1, "appliance.tls": 1, "appliance.examples": 1, "appliance.systemd": 1,
    "appliance.engine": 2,
    # Settings describe every component, in the engine's own terms where it has them (a cache config).
    "appliance.repository": 3, "appliance.settings": 3,
    "appliance.security": 4, "appliance.client": 4, "appliance.mdns": 4, "appliance.selection": 4,
    "appliance.protocol": 5, "appliance.metrics": 5,
    "appliance.rest": 6, "appliance.grpc": 6,
    "appliance.composition": 7,
    "appliance.commands": 8,
    "appliance.cli": 9, "appliance.__main__": 9,
}


def module_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of the package (under ``root``) -> the modules of the package it imports, at any
    level, type-checking imports included; ``from pkg import mod`` counts as importing ``mod``."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(filter(None, (resolve(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                for alias in node.names:
                    target = resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in names else resolve(base)
                    if target is not None:
                        found.add(target)
        graph[module] = found - {module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph``: its strongly connected components of more than one node (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _top(module: str) -> str:
    return ".".join(module.split(".")[:2])


def dependency_report(root: Path = PACKAGE) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """(module cycles, package cycles, upward imports) of the package under ``root``."""
    graph = module_graph(root)
    packages: dict[str, set[str]] = {}
    upward = []
    for module, targets in graph.items():
        for target in targets:
            source, destination = _top(module), _top(target)
            if source != destination:
                packages.setdefault(source, set()).add(destination)
                if LAYERS.get(source, 99) < LAYERS.get(destination, 99):
                    upward.append(f"{module} -> {target}")
    return strongly_connected(graph), strongly_connected(packages), sorted(upward)


def test_no_import_cycles_and_no_upward_imports(capsys):
    modules, packages, upward = dependency_report()
    with capsys.disabled():
        print(f"\nimport cycles between modules: {len(modules)}, between packages: {len(packages)}; "
              f"upward imports: {len(upward)}")
    assert set(_top(m) for m in module_graph()) <= set(LAYERS), "a new top-level module needs a layer in LAYERS"
    assert modules == [], modules
    assert packages == [], packages
    assert upward == [], upward
