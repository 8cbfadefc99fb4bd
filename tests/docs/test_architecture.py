"""docs/architecture.md against the tree: every directory and module its package map names is where the map
says, every source path the page names elsewhere exists, and every package of the appliance is on the map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
_DESCRIPTION_COLUMN = 24  # a line indented this far continues the description above it


def package_map(text: str) -> list[tuple[int, str]]:
    """The map's code block as (line number, line)."""
    lines = text.splitlines()
    start = lines.index("## Package map")
    opening = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return [(i + 1, lines[i]) for i in range(opening + 1, closing)]


def map_problems(text: str, root: Path = ROOT) -> list[str]:
    """What the map names that is not there: a directory under its parent line's directory, a module in
    its line's directory (the names before the description) or anywhere below it (in the description)."""
    problems: list[str] = []
    parents: list[tuple[int, Path]] = []  # (indent, directory) of the enclosing lines
    directory = root
    for number, line in package_map(text):
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if indent < _DESCRIPTION_COLUMN:
            names, _, description = line.strip().partition("  ")
            while parents and parents[-1][0] >= indent:
                parents.pop()
            base = parents[-1][1] if parents else root
            directory = base
            for name in re.findall(r"[\w.]+/?", names.replace(",", " ")):
                if name.endswith("/"):
                    directory = base / name.rstrip("/")
                    if not directory.is_dir():
                        problems.append(f"line {number}: no directory {directory.relative_to(root)}")
                    parents.append((indent, directory))
                elif name.endswith(".py") and not (base / name).is_file():
                    problems.append(f"line {number}: no module {(base / name).relative_to(root)}")
        else:
            description = line
        for module in re.findall(r"\b([\w/]+\.py)\b", description):
            if not list(directory.rglob(module.rsplit("/", 1)[-1])) or not any(
                    str(found).endswith(module) for found in directory.rglob(module.rsplit("/", 1)[-1])):
                problems.append(f"line {number}: no module {module} under {directory.relative_to(root)}")
    return problems


def test_the_package_map_names_only_what_exists():
    assert map_problems(PAGE.read_text()) == []


def test_every_package_of_the_appliance_is_on_the_map():
    mapped = {line.strip().split()[0].rstrip("/") for _, line in package_map(PAGE.read_text())
              if line.strip() and len(line) - len(line.lstrip()) < _DESCRIPTION_COLUMN}
    packages = {path.parent.name for path in (ROOT / "appliance").glob("*/__init__.py")}
    assert packages - mapped == set()


def test_every_source_path_the_page_names_exists():
    text = PAGE.read_text()
    missing = [path for path in sorted(set(re.findall(r"`((?:appliance|tests|bench)/[\w/.]+\.py)", text)))
               if not (ROOT / path).is_file()]
    relative = [path for path in sorted(set(re.findall(r"`([a-z_]+/[\w/]+\.py)", text)))
                if not path.startswith(("appliance/", "tests/", "bench/")) and not (ROOT / "appliance" / path).is_file()
                and not (ROOT / "tests" / "appliance" / path).is_file()]
    assert missing + relative == []


def test_a_module_that_moved_is_caught(tmp_path):
    (tmp_path / "appliance" / "engine").mkdir(parents=True)
    (tmp_path / "appliance" / "engine" / "model.py").write_text("")
    page = ("## Package map\n\n```\nappliance/\n  engine/               running a model: model.py\n"
            "    model.py gone.py    what is served\n  nowhere/              nothing\n```\n")
    assert map_problems(page, tmp_path) == ["line 6: no module appliance/engine/gone.py",
                                            "line 7: no directory appliance/nowhere"]
