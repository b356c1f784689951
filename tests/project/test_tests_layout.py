"""The tests stay laid out by feature (tests/README.md): no test module directly in tests/, every folder a
package, no test module importing another (shared helpers live in tests/helpers.py), and every Llama test under
tests/families/llama/.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

TESTS = REPO / "tests"
# Folders of data and plugin packages the tests put on PYTHONPATH: not test folders.
NOT_TESTS = {"data", "deadline_plugin", "hostile_plugin", "report_plugin", "__pycache__"}


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if not NOT_TESTS & set(p.relative_to(TESTS).parts))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement of `path` names (at any depth: imports inside functions count)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from tests.x import test_y`
    return names


def _is_test_module(name: str) -> bool:
    return name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")


def test_the_tests_are_found() -> None:
    """The checks below read real modules (an empty list would make them pass vacuously)."""
    modules = _test_modules()
    assert len(modules) > 50, modules
    assert any(p.parent == TESTS / "families" / "llama" for p in modules)


def test_no_test_module_directly_in_tests() -> None:
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not flat, f"test modules belong in a feature folder (tests/README.md), not tests/: {flat}"


def test_every_test_folder_is_a_package() -> None:
    """`tests.<folder>.test_x` imports work and two modules may share a file name in different folders."""
    missing = sorted(str(p.parent.relative_to(REPO)) for p in _test_modules()
                     if not (p.parent / "__init__.py").is_file())
    assert not missing, f"test folders without __init__.py: {sorted(set(missing))}"


def test_no_test_module_imports_another() -> None:
    """A helper two modules share goes to tests/helpers.py; a module may name itself (a subprocess re-imports it)."""
    offenders = []
    for path in [*_test_modules(), TESTS / "conftest.py", TESTS / "helpers.py"]:
        own = _module_name(path)
        others = sorted(n for n in _imported_modules(path) if _is_test_module(n) and n != own)
        if others:
            offenders.append(f"{path.relative_to(REPO)}: {others}")
    assert not offenders, "test modules importing test modules:\n" + "\n".join(offenders)


def test_the_import_check_sees_a_test_module_import(tmp_path: Path) -> None:
    """The check above can fail: it finds a test module imported at top level and inside a function."""
    source = tmp_path / "test_probe.py"
    source.write_text("from tests.cli.test_cli import x\n\ndef f():\n    import tests.run.test_parity_full\n"
                      "from tests import helpers\nfrom tests.run import test_lanes\n")
    found = {n for n in _imported_modules(source) if _is_test_module(n)}
    assert found == {"tests.cli.test_cli", "tests.run.test_parity_full", "tests.run.test_lanes"}


def test_every_llama_test_is_under_families_llama() -> None:
    """A family's tests are found in one place: every module naming Llama in its file name is there."""
    modules = _test_modules()
    llama = [p for p in modules if "llama" in p.name]
    assert llama, "no Llama test module found"
    misplaced = sorted(str(p.relative_to(REPO)) for p in llama if p.parent != TESTS / "families" / "llama")
    assert not misplaced, f"Llama tests outside tests/families/llama/: {misplaced}"
