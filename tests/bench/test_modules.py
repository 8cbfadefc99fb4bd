"""Every benchmark module imports and parses its command line (they are run by hand, so a broken import
would otherwise go unnoticed until someone measures)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import bench

MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    importlib.import_module(f"bench.{name}")


@pytest.mark.parametrize("name", [m for m in MODULES if hasattr(importlib.import_module(f"bench.{m}"), "main")])
def test_bench_command_line_parses(name):
    result = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
