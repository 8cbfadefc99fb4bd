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


@pytest.mark.parametrize("leaf", ["appliance.tensors", "appliance.config_json", "appliance.errors"])
def test_leaf_modules_import_nothing_of_the_appliance_but_its_errors(leaf):
    assert _violations(leaf, ("appliance.errors",)) == []


def test_backends_import_only_the_leaf_modules():
    allowed = ("appliance.backends", "appliance.tensors", "appliance.config_json", "appliance.errors")
    assert _violations("appliance.backends", allowed) == []


@pytest.mark.parametrize("package", ["appliance.engine", "appliance.repository", "appliance.protocol"])
def test_the_core_knows_no_front_end(package):
    for path in _modules(package):
        names = _all_imports(path)
        assert not {n for n in names if n.split(".")[0] in ("aiohttp", "grpc")}, path
        assert not {n for n in names if n.startswith(("appliance.rest", "appliance.grpc", "appliance.composition",
                                                      "appliance.daemon", "appliance.cli"))}, path


def test_the_engine_knows_neither_the_repository_nor_the_protocol():
    allowed = ("appliance.engine", "appliance.backends", "appliance.tensors", "appliance.config_json",
               "appliance.errors")
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
