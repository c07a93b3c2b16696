"""The layers of docs/architecture.md ("Layers: who may import whom") hold: every import in
``cosycompile/``, top-level or inside a function, is checked against the doc's two tables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
SECTION = "## 6. Layers: who may import whom"


def _tables(doc: str) -> list[list[list[str]]]:
    """The Markdown tables of the layers section, as rows of cells (header and rule lines dropped)."""
    text = doc.split(SECTION, 1)[1].split("\n## ", 1)[0]
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif rows:
            tables.append(rows[1:])  # the header row
            rows = []
    return tables


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def top_level(root: Path) -> set[str]:
    """The top-level packages and modules of the package at ``root``."""
    return ({p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
            | {p.stem for p in root.glob("*.py") if p.stem != "__init__"})


def rules_from(doc: str, names: set[str]) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """(package -> the top-level names it may not import, the listed exceptions as (module, import))."""
    tables = _tables(doc)
    # The exceptions table is there only while exceptions remain.
    rules_table, exceptions_table = tables[0], (tables[1] if len(tables) > 1 else [])
    rules = {}
    for package, cell in rules_table:
        (package,) = _names(package)
        if cell == "nothing":
            forbidden: set[str] = set()
        elif cell.startswith("everything"):
            forbidden = names - _names(cell) - {package}
        else:
            forbidden = _names(cell)
        rules[package] = forbidden
    exceptions = {(next(iter(_names(m))), next(iter(_names(i)))) for m, i, _ in exceptions_table}
    return rules, exceptions


def _imported(node: ast.AST, parts: list[str], is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if not node.level:
            return [node.module or ""]
        base = parts[:len(parts) - node.level + (1 if is_package else 0)]
        return [".".join(base + ([node.module] if node.module else []))]
    return []


def violations(root: Path, rules: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importing module, imported module) for every import under ``root`` (a package named
    ``root.name``) that its top-level package's rule forbids."""
    found = set()
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        top = parts[1] if len(parts) > 1 else ""
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            for name in _imported(node, parts, is_package):
                pieces = name.split(".")
                if pieces[0] == root.name and len(pieces) > 1 and pieces[1] in rules.get(top, set()):
                    found.add((".".join(parts), name))
    return found


def test_every_top_level_package_has_a_rule() -> None:
    names = top_level(REPO / "cosycompile")
    rules, _ = rules_from(DOC.read_text(), names)
    assert set(rules) == names, f"rows missing: {sorted(names - set(rules))}, rows for nothing: {sorted(set(rules) - names)}"


def test_imports_keep_the_layers_and_the_exception_list_is_exact() -> None:
    root = REPO / "cosycompile"
    rules, exceptions = rules_from(DOC.read_text(), top_level(root))
    found = violations(root, rules)
    assert not found - exceptions, f"imports the layers forbid: {sorted(found - exceptions)}"
    assert not exceptions - found, f"exceptions that no longer occur (remove their rows): {sorted(exceptions - found)}"


@pytest.mark.parametrize("line", ["from cosycompile.commands.run import main",
                                  "import cosycompile.commands",
                                  "from ..commands import run"])
def test_a_forbidden_import_fails(tmp_path: Path, line: str) -> None:
    """The check finds a forbidden import in every spelling, also one inside a function."""
    pkg = tmp_path / "cosycompile"
    for sub in ("core", "commands"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "graph.py").write_text(f"def f():\n    {line}\n")
    (pkg / "commands" / "run.py").write_text("from cosycompile.core import graph\n")
    rules, _ = rules_from(DOC.read_text(), top_level(pkg))
    found = violations(pkg, rules)
    assert {m for m, _ in found} == {"cosycompile.core.graph"}, found


# Test folders that mirror a top-level folder of the repository rather than the package, or that
# test across it (hostile inputs, the portable bundle from build to another machine).
NOT_PACKAGES = {"bench": "bench/", "recipes": "recipes/", "data": "fixtures", "hostile": "every entry point",
                "bundle": "a bundle's whole journey", "examples": "examples/"}


def test_tests_mirror_the_package() -> None:
    """Every test sits in the folder of the package it tests; no test file at the top of tests/."""
    tests = REPO / "tests"
    assert not [p.name for p in tests.glob("test_*.py")], "a test file at the top of tests/: move it to its package's folder"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {p.name for p in (REPO / "cosycompile").iterdir() if (p / "__init__.py").is_file()}
    assert folders - packages <= set(NOT_PACKAGES), sorted(folders - packages - set(NOT_PACKAGES))
