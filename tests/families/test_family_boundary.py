"""A model family is its table and the modules the table names: no other module knows a family by name.

Issue 38's acceptance: adding the Llama family changes no module outside its family files, the family registry
(`parity_reference/families/*.json`, read by `parity_reference/families.py`) and each backend's family support
(`_backends/`). So the code of every other module (identifiers and string constants; docstrings and comments may
name a family as an example) never says "llama": a third family is a table, its modules and its backends' support.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from parity_reference.families import CODE_ROLES, family_names, load_family

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "harness" / "parity_harness", ROOT / "reference" / "parity_reference")
FAMILY = "llama"  # the family added second: nothing outside its own files names it


def _family_file(path: Path) -> bool:
    """Its own files: `llama_*.py` in any layer (the table names them), the registry, and the backends."""
    rel = path.relative_to(ROOT).as_posix()
    return (path.name.startswith(f"{FAMILY}_") or rel.startswith("harness/parity_harness/_backends/")
            or rel == "reference/parity_reference/families.py")


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _mentions(path: Path) -> list[str]:
    """Each line of code (not a docstring or comment) whose identifiers or strings name the family."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    pattern = re.compile(FAMILY, re.IGNORECASE)
    hits: list[str] = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.alias | ast.FunctionDef | ast.ClassDef):
            text = node.name
        elif isinstance(node, ast.ImportFrom):
            text = node.module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
        if text and pattern.search(text):
            hits.append(f"{path.relative_to(ROOT).as_posix()}:{getattr(node, 'lineno', '?')}: {text[:60]!r}")
    return hits


def test_no_module_outside_a_familys_files_names_it() -> None:
    hits = [hit for package in PACKAGES for path in sorted(package.rglob("*.py")) if not _family_file(path)
            for hit in _mentions(path)]
    assert not hits, "modules outside the family's files name it:\n" + "\n".join(hits)


def test_the_scan_sees_a_mention() -> None:
    """The scan is not vacuous: the family's own modules name it."""
    assert _mentions(ROOT / "reference" / "parity_reference" / f"{FAMILY}_model.py") or _mentions(
        ROOT / "harness" / "parity_harness" / "_authoring" / f"{FAMILY}_family.py")


def test_every_family_names_a_module_for_every_role_and_each_imports() -> None:
    for name in family_names():
        family = load_family(name)
        assert sorted(family.code) == sorted(CODE_ROLES)
        for role in CODE_ROLES:
            module = family.module(role)
            assert module.__name__ == family.code[role]
