"""Every name a user types exists: the distribution and its extras in every `pip install` and every dependency
list we show, the modules every example and documented code block imports (public ones only), and the names
of docs/api.md's section on depending on parity from another project.

The distribution is `parity-harness` (pyproject.toml's `[project] name`), with the extras its
`[project.optional-dependencies]` declares; `parity` alone is the command, not a distribution, and a
`pip install 'parity[node]'` fails. Public modules: no `_`-prefixed component (`parity_harness.api`,
`parity_harness.plugin`, `parity_reference.*`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from tests.helpers import make_child_env

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DISTRIBUTION: str = PYPROJECT["project"]["name"]
EXTRAS: set[str] = set(PYPROJECT["project"]["optional-dependencies"])
GUIDE = REPO / "docs" / "adding-a-backend.md"

# Where a user reads a `pip install` line or an import to copy.
DOC_FILES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
EXAMPLE_FILES = sorted(p for p in (REPO / "examples").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
TS_FILES = sorted(
    p for ext in ("*.mjs", "*.mts", "*.ts") for p in (REPO / "ts_model").rglob(ext) if "node_modules" not in p.parts
)
HARNESS_FILES = sorted((REPO / "harness" / "parity_harness").rglob("*.py"))

# Code blocks that import private modules on purpose, each with its reason: not for a user to copy.
PRIVATE_IMPORTS_ALLOWED = {
    # A maintainer's reproduction of a TransformerLens finding, "from a checkout": it calls the backend's
    # own converters (tl_config, tl_state_dict) to show what TransformerLens' loader does to them.
    ("docs/backends.md", "parity_harness._fixture.fixture"),
    ("docs/backends.md", "parity_harness._backends.transformerlens_backend"),
}

CODE_BLOCK = re.compile(r"^```([\w-]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
PIP_INSTALL = re.compile(r"\bpip install((?:[ \t]+(?:'[^'\n]*'|\"[^\"\n]*\"|[^\s`'\"#;&|)]+))*)")


@dataclass(frozen=True)
class Requested:
    where: str  # file:line
    text: str  # the requirement as written


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _requirement_problem(text: str) -> str | None:
    """Why this requirement names no real parity distribution or extra (None: fine, or not parity's)."""
    if text.startswith((".", "/")) or "/" in text:  # a path: only its extras can be checked
        extras = re.findall(r"\[([^\]]*)\]$", text)
        names = {e.strip() for group in extras for e in group.split(",")}
        unknown = names - EXTRAS
        return f"extras {sorted(unknown)} are not declared in pyproject.toml" if unknown else None
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None  # prose after `pip install` ("of any package"): not a requirement
    name = canonicalize_name(req.name)
    if not name.startswith("parity"):
        return None  # another project's distribution
    if name in {canonicalize_name(n) for n in ("my-parity-backend", "parity-example-plugin")}:
        return None  # the guide's and the examples' own packages
    if name != canonicalize_name(DISTRIBUTION):
        return f"{req.name!r} is not a distribution (the distribution is {DISTRIBUTION!r})"
    unknown = set(req.extras) - EXTRAS
    return f"extras {sorted(unknown)} are not declared in pyproject.toml" if unknown else None


def pip_install_requests() -> list[Requested]:
    """Every argument of every `pip install` in the docs, README, examples, TypeScript entry points and harness."""
    found: list[Requested] = []
    for path in [*DOC_FILES, *EXAMPLE_FILES, *TS_FILES, *HARNESS_FILES]:
        if path.suffix not in {".md", ".py", ".toml", ".mjs", ".mts", ".ts", ".txt"}:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in PIP_INSTALL.finditer(line):
                try:
                    words = shlex.split(match.group(1))
                except ValueError:
                    words = match.group(1).split()
                for word in words:
                    if not word.startswith("-"):
                        found.append(Requested(f"{_rel(path)}:{lineno}", word))
    return found


def test_every_pip_install_names_the_distribution_and_declared_extras() -> None:
    requests = pip_install_requests()
    ours = [r for r in requests if "parity" in r.text or r.text.startswith(".")]
    assert len(ours) >= 20, ours  # the scan finds the project's own install lines (it can fail)
    problems = [f"{r.where}: pip install {r.text}: {p}" for r in requests if (p := _requirement_problem(r.text))]
    assert not problems, "\n".join(problems)


def test_the_scan_catches_the_old_names() -> None:
    """The rule itself: `parity[node]` (verify.mjs's old hint) and an undeclared extra are refused."""
    assert _requirement_problem("parity[node]") is not None
    assert _requirement_problem("parity") is not None
    assert _requirement_problem("parity-harness[nodes]") is not None
    assert _requirement_problem("parity-harness[node]") is None
    assert _requirement_problem(".[all]") is None and _requirement_problem(".[everything]") is not None


def _toml_blocks(path: Path) -> list[dict[str, object]]:
    return [tomllib.loads(body) for lang, body in CODE_BLOCK.findall(path.read_text()) if lang == "toml"]


def _dependencies(project: dict[str, object]) -> list[str]:
    deps = project.get("dependencies", [])
    assert isinstance(deps, list)
    return [str(d) for d in deps]


def test_every_dependency_list_shown_names_the_distribution() -> None:
    """pyproject files of the examples, and TOML blocks of the docs that declare a project's dependencies."""
    projects: list[tuple[str, dict[str, object]]] = []
    for path in (REPO / "examples").rglob("pyproject.toml"):
        projects.append((_rel(path), tomllib.loads(path.read_text())["project"]))
    for path in DOC_FILES:
        for data in _toml_blocks(path):
            project = data.get("project")
            if isinstance(project, dict) and "dependencies" in project:
                projects.append((_rel(path), project))
    assert len(projects) >= 4, projects  # two examples and the guide's two packages (api.md's section: below)
    problems = [f"{where}: {dep}: {p}" for where, project in projects for dep in _dependencies(project)
                if (p := _requirement_problem(dep))]
    assert not problems, "\n".join(problems)
    for where, project in projects:
        names = {canonicalize_name(Requirement(d).name) for d in _dependencies(project)}
        assert canonicalize_name(DISTRIBUTION) in names, f"{where}: {project.get('name')} does not depend on parity"


# -- imports ---------------------------------------------------------------------------------------


def _imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import of parity's packages in a piece of Python (or shell
    with Python in it: a line-by-line fallback that reads only the module)."""
    out: list[tuple[str, list[str]]] = []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        for match in re.finditer(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", source, re.MULTILINE):
            out.append((match.group(1) or match.group(2), []))
        return [(m, n) for m, n in out if m.split(".")[0] in {"parity_harness", "parity_reference"}]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return [(m, n) for m, n in out if m.split(".")[0] in {"parity_harness", "parity_reference"}]


def documented_imports() -> list[tuple[str, str, list[str]]]:
    """(file, module, names) for examples/**.py and every code block of docs/*.md and README.md."""
    found: list[tuple[str, str, list[str]]] = []
    for path in EXAMPLE_FILES:
        if path.suffix == ".py":
            found += [(_rel(path), m, n) for m, n in _imports(path.read_text())]
    for path in [*DOC_FILES, *(p for p in EXAMPLE_FILES if p.suffix == ".md")]:
        for _lang, body in CODE_BLOCK.findall(path.read_text()):
            found += [(_rel(path), m, n) for m, n in _imports(body)]
    return found


def test_examples_and_documented_code_import_only_public_modules_that_resolve() -> None:
    found = documented_imports()
    assert len(found) >= 6, found
    problems = []
    for where, module, names in found:
        if any(part.startswith("_") for part in module.split(".")) and (where, module) not in PRIVATE_IMPORTS_ALLOWED:
            problems.append(f"{where}: imports the private module {module}")
            continue
        if importlib.util.find_spec(module) is None:
            problems.append(f"{where}: no module {module}")
            continue
        imported = importlib.import_module(module)
        for name in names:
            if not hasattr(imported, name) and importlib.util.find_spec(f"{module}.{name}") is None:
                problems.append(f"{where}: {module} has no {name}")
    assert not problems, "\n".join(problems)


def test_the_private_import_rule_can_fail() -> None:
    assert _imports("from parity_harness._backends.numpy_backend import NumpyBackend\n") == [
        ("parity_harness._backends.numpy_backend", ["NumpyBackend"])
    ]
    assert _imports("python - <<'EOF'\nfrom parity_harness.api import run\nEOF\n") == [("parity_harness.api", [])]


# -- docs/api.md: depending on parity from another project ------------------------------------------


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_page_on_depending_on_parity_names_what_exists() -> None:
    section = _section(REPO / "docs" / "api.md", "Depending on parity from another project")
    blocks = [tomllib.loads(body) for lang, body in CODE_BLOCK.findall(section) if lang == "toml"]
    assert blocks, "the section shows a pyproject.toml"
    declared_groups = set(PYPROJECT["project"]["entry-points"])
    for data in blocks:
        deps = [Requirement(d) for d in data["project"]["dependencies"]]
        assert any(canonicalize_name(d.name) == canonicalize_name(DISTRIBUTION) for d in deps)
        assert not [p for d in data["project"]["dependencies"] if (p := _requirement_problem(d))]
        assert set(data["project"].get("entry-points", {})) <= declared_groups
    assert f"`{DISTRIBUTION}`" in section
    # every extra the table names is declared, and every declared extra a user would pick is in the table
    named = set(re.findall(r"`([a-z-]+)`", section.split("| extra |", 1)[1].split("\n\n", 1)[0]))
    assert named & EXTRAS == EXTRAS - {"test", "lint"}, named
    plugin = PYPROJECT["project"]["entry-points"]["pytest11"]
    assert f'parity = "{plugin["parity"]}"' in section  # the pytest plugin's entry point, as registered
    assert importlib.util.find_spec(plugin["parity"]) is not None
    for module in re.findall(r"`(parity_(?:harness|reference)[\w.]*)`", section):
        assert importlib.util.find_spec(module) is not None, module
    # README's install paragraph points at it, by the anchor GitHub makes of the heading
    assert "(docs/api.md#depending-on-parity-from-another-project)" in (REPO / "README.md").read_text()


# -- the guide's packages install with their dependencies as written ---------------------------------

GUIDE_FILE = re.compile(r"<!--\s*guide-(step|onnx-step):\s*file\s+(\S+)\s*-->\s*\n```[\w-]*\n(.*?)\n```", re.DOTALL)


def _guide_packages(root: Path) -> list[Path]:
    """Write every file the guide's two walk-throughs create under root; the package directories."""
    dirs: list[Path] = []
    for _kind, rel, body in GUIDE_FILE.findall(GUIDE.read_text()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body + "\n")
        if path.name == "pyproject.toml":
            dirs.append(path.parent)
    return dirs


def _pip_install_with_dependencies(python: Path, package: Path) -> subprocess.CompletedProcess[str]:
    """`pip install PACKAGE` resolving its dependencies as written, offline: they must already be installed."""
    return subprocess.run(
        [str(python), "-m", "pip", "install", "--no-build-isolation", "--no-index", "--disable-pip-version-check",
         str(package)],
        capture_output=True, text=True, timeout=300, cwd=package.parent,
    )


@pytest.mark.full
def test_the_guides_packages_install_with_their_dependencies(tmp_path: Path) -> None:
    """Into a venv that sees this environment (parity-harness installed): the dependencies as the guide writes
    them resolve; with the old name `parity` pip refuses the same package."""
    packages = _guide_packages(tmp_path / "work")
    assert [p.name for p in packages] == ["my-parity-backend", "my-onnx-backend"]
    python = make_child_env(tmp_path / "venv")
    for package in packages:
        proc = _pip_install_with_dependencies(python, package)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    old = packages[0]
    pyproject = old / "pyproject.toml"
    text = pyproject.read_text()
    assert f'"{DISTRIBUTION}"' in text
    pyproject.write_text(text.replace(f'"{DISTRIBUTION}"', '"parity"').replace('name = "my-parity-backend"',
                                                                              'name = "my-old-parity-backend"'))
    proc = _pip_install_with_dependencies(python, old)
    assert proc.returncode != 0 and "No matching distribution found for parity" in proc.stderr, proc.stderr
