"""docs/architecture.md's tree is the tree: every module listed exists, every module that exists is listed.

Also the rule the layers promise: exit codes are decided in `_cli/` only (`_cli/exit_codes.py`); below it, code
returns a `Verdict` and never a number of its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
ROOTS = ("harness/parity_harness", "reference/parity_reference")


def documented_tree() -> set[str]:
    """The paths the doc's tree block lists, from its indentation (4 spaces a level)."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- tree: begin -->", 1)[1].split("<!-- tree: end -->", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("```")]
    paths: set[str] = set()
    stack: list[str] = []
    for line in lines:
        depth = (len(line) - len(line.lstrip(" "))) // 4
        name = line.strip().split()[0]
        if depth == 0:
            stack = [name.rstrip("/")]
            continue
        stack = stack[:depth]
        path = "/".join([*stack, name.rstrip("/")])
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
        else:
            paths.add(path)
    return paths


def actual_tree() -> set[str]:
    found: set[str] = set()
    for root in ROOTS:
        for p in (REPO / root).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".json") and "__pycache__" not in p.parts \
                    and p.name != "__init__.py":
                found.add(p.relative_to(REPO).as_posix())
    return found


def test_the_architecture_tree_lists_exactly_the_modules_that_exist() -> None:
    documented, actual = documented_tree(), actual_tree()
    assert documented, "no tree found between the markers in docs/architecture.md"
    assert sorted(actual - documented) == [], "modules missing from docs/architecture.md's tree"
    assert sorted(documented - actual) == [], "docs/architecture.md lists modules that do not exist"


def test_the_tree_check_sees_a_missing_module(tmp_path: Path) -> None:
    """The check can fail: a tree without one real module differs from the real one."""
    documented = documented_tree()
    some = sorted(documented)[0]
    assert some in actual_tree() and (documented - {some}) != actual_tree()


EXIT_WORDS = re.compile(r"\bEXIT_\w+\b")


def _decides_an_exit_code(tree: ast.AST) -> list[str]:
    """Where a module defines an `exit_code` of its own or uses an EXIT_* constant: deciding a code."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "exit_code":
            found.append(f"line {node.lineno}: def exit_code")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
                if name == "exit_code" or EXIT_WORDS.fullmatch(name or ""):
                    found.append(f"line {node.lineno}: {name} =")
        elif isinstance(node, ast.Name) and EXIT_WORDS.fullmatch(node.id):
            found.append(f"line {node.lineno}: {node.id}")
    return found


def test_exit_codes_are_decided_in_the_cli_only() -> None:
    offenders = {}
    for p in sorted((REPO / "harness" / "parity_harness").rglob("*.py")):
        rel = p.relative_to(REPO / "harness" / "parity_harness")
        if rel.parts[0] == "_cli":
            continue
        found = _decides_an_exit_code(ast.parse(p.read_text(encoding="utf-8")))
        if found:
            offenders[rel.as_posix()] = found
    assert offenders == {}


def test_the_exit_code_scan_sees_a_decision() -> None:
    probe = "class R:\n    @property\n    def exit_code(self):\n        return EXIT_OK\n"
    assert len(_decides_an_exit_code(ast.parse(probe))) == 2


def import_graph() -> dict[str, set[str]]:
    """Every parity_harness module -> the parity_harness modules it imports anywhere (in functions and under
    TYPE_CHECKING too)."""
    root = REPO / "harness"
    modules: dict[str, Path] = {}
    for p in (root / "parity_harness").rglob("*.py"):
        name = ".".join(p.relative_to(root).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("parity_harness"):
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("parity_harness")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_module_imports_itself_back_through_another() -> None:
    graph = import_graph()
    assert len(graph) > 80
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]  # the check sees a cycle where there is one


def _packages_missing_from(pyproject: dict[str, object], root: Path) -> list[str]:
    """Every Python package directory under ROOTS (one with an __init__.py) that pyproject's packages leave out."""
    tool = pyproject["tool"]
    assert isinstance(tool, dict)
    listed = set(tool["setuptools"]["packages"])
    missing = []
    for top in ROOTS:
        base = root / top
        for init in sorted(base.rglob("__init__.py")):
            if "__pycache__" in init.parts:
                continue
            name = ".".join((base.name, *init.parent.relative_to(base).parts))
            if name not in listed:
                missing.append(name)
    return missing


def test_the_wheel_lists_every_python_package() -> None:
    """A subpackage left out of [tool.setuptools] packages is missing from the wheel, and every backend in it
    crashes on import in an installed parity (llama-cpp's `_backends.ggml` did, caught by test_install's wheel run
    in the full set only)."""
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert _packages_missing_from(pyproject, REPO) == []
    pyproject["tool"]["setuptools"]["packages"].remove("parity_harness._backends.ggml")
    assert _packages_missing_from(pyproject, REPO) == ["parity_harness._backends.ggml"]
