"""parity_harness.plugin is the one place plugins import from: cheap, complete for the built-ins' needs, documented."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

import parity_harness.plugin as surface
from tests.helpers import REPO

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


def test_every_exported_name_resolves_and_is_documented() -> None:
    guide = (REPO / "docs" / "adding-a-backend.md").read_text(encoding="utf-8")
    section = guide.split("## What a plugin imports: `parity_harness.plugin`")[1].split("\n## ")[0]
    assert surface.__all__ and len(set(surface.__all__)) == len(surface.__all__)
    for name in surface.__all__:
        assert getattr(surface, name) is not None, name
        assert f"`{name}`" in section, f"{name} is exported by parity_harness.plugin but not in the guide's table"


def test_importing_the_surface_imports_no_heavy_library() -> None:
    heavy = ("torch", "onnx", "onnxruntime", "transformers")
    code = ("import sys, json, parity_harness.plugin; "
            f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_the_guide_and_the_example_plugin_import_parity_only_through_the_surface() -> None:
    """The code users copy (docs/adding-a-backend.md's backends, examples/plugin) imports parity_harness.plugin only."""
    guide = (REPO / "docs" / "adding-a-backend.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in guide.split("```python\n")[1:]]
    sources = [b for b in blocks if "class " in b and "(Backend)" in b]
    sources.append((REPO / "examples" / "plugin" / "parity_example_plugin" / "__init__.py").read_text())
    assert len(sources) >= 3
    for source in sources:
        modules = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.module}
        assert {m for m in modules if m.startswith("parity_harness")} == {"parity_harness.plugin"}, modules
