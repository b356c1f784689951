"""The TypeScript side laid out by job: ts_model/model/ runs anywhere, and its own type check proves it.

- model/ imports only model/: no `node:` module, no package, nothing of node/, browser/ or web/;
- ts_model/model/tsconfig.json (`"lib": ["es2023"]`, `"types": []`) accepts the model as it is and
  refuses a `node:` import or a Node global planted in a copy, which the repository's tsconfig.json
  (every file, with Node's types) accepts: the model's own check is what catches it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from parity_harness._backends.node.runtime import find_node
from parity_harness._core.errors import BackendUnavailable
from tests.helpers import REPO

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

MODEL = REPO / "ts_model" / "model"
IMPORT = re.compile(  # `import ... from "X"`, `export ... from "X"`, `import "X"`: the module X
    r'^\s*(?:import|export)\b[^"\']*?\bfrom\s+["\']([^"\']+)["\']|^\s*import\s+["\']([^"\']+)["\']', re.M)


@pytest.fixture(scope="module")
def tsc() -> list[str]:
    """`node node_modules/typescript/bin/tsc` of this checkout (after `npm ci`)."""
    script = REPO / "node_modules" / "typescript" / "bin" / "tsc"
    try:
        node = find_node()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    if not script.is_file():
        pytest.skip("the TypeScript compiler needs `npm ci` in the parity checkout")
    return [node, str(script)]


def run_tsc(tsc: list[str], project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*tsc, "-p", str(project)], capture_output=True, text=True, timeout=300, check=False)


def test_the_model_imports_only_the_model() -> None:
    files = sorted(MODEL.glob("*.ts"))
    assert {f.name for f in files} >= {"model.ts", "erf.ts", "taps.ts", "fixture.ts", "safetensors.ts", "compare.ts"}
    for f in files:
        for match in IMPORT.finditer(f.read_text(encoding="utf-8")):
            spec = match.group(1) or match.group(2)
            assert spec.startswith("./") and "/" not in spec[2:], f"{f.name} imports {spec!r}"
            assert (MODEL / spec[2:]).is_file(), f"{f.name} imports {spec!r}, which is not in model/"


def planted_copy(tmp_path: Path, line: str) -> Path:
    """tsconfig.json, package.json and ts_model/model/ copied, with `line` added to model.ts after its import."""
    (tmp_path / "ts_model").mkdir()
    for name in ("tsconfig.json", "package.json"):  # the compiler options; "type": "module"
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(REPO / "node_modules", target_is_directory=True)  # @types/node
    shutil.copytree(MODEL, tmp_path / "ts_model" / "model")
    model = tmp_path / "ts_model" / "model" / "model.ts"
    anchor = 'import { erf } from "./erf.ts";\n'
    source = model.read_text(encoding="utf-8")
    assert source.count(anchor) == 1
    model.write_text(source.replace(anchor, anchor + line + "\n"), encoding="utf-8")
    return tmp_path


def test_the_models_own_type_check_passes(tsc: list[str]) -> None:
    proc = run_tsc(tsc, MODEL / "tsconfig.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("line", "name"), [
    ('import fs from "node:fs";\nexport const probe = fs;', "node:fs"),
    ("export const probe = process.argv;", "process"),
    ('export const probe = Buffer.from("x");', "Buffer"),
    ("export const probe = document.title;", "document"),
], ids=["node-import", "process", "Buffer", "document"])
def test_a_node_import_or_global_in_the_model_is_a_type_error(tsc: list[str], tmp_path: Path, line: str,
                                                              name: str) -> None:
    root = planted_copy(tmp_path, line)
    proc = run_tsc(tsc, root / "ts_model" / "model" / "tsconfig.json")
    assert proc.returncode != 0
    errors = [ln for ln in proc.stdout.splitlines() if ": error TS" in ln]
    assert len(errors) == 1 and "model.ts(20," in errors[0] and f"'{name}'" in errors[0], proc.stdout
    # The repository's check (Node's types and the DOM) accepts the same copy: only the model's refuses it.
    assert run_tsc(tsc, root / "tsconfig.json").returncode == 0
