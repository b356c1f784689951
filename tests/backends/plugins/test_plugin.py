"""The example plugin (examples/plugin): a backend in its own package, found through the entry point.

It is installed (`pip install --no-deps --no-build-isolation`, no network) into a fresh virtual
environment that sees this one's packages through a .pth file, so the environment running the tests
is never changed. Then, through the CLI: `backends` lists it, `run` compares it (exit 0, JSON rows,
"not_supported" for the taps it leaves out), `check-backend` passes, and its demo bug
(PARITY_EXAMPLE_PLUGIN_BUG=1, positions in float32) is caught at `hook_pos_embed` in the fp64 tier.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness._fixture.fixture import Fixture, load_fixture
from tests.helpers import build_random_fixture, make_child_env, max_error, needs_cli, pip_install_command, run_harness

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)

REPO = Path(__file__).resolve().parents[3]
PLUGIN = REPO / "examples" / "plugin"
NAME = "example-numpy64"


def pip_install(python: Path, *args: str, cwd: Path) -> None:
    proc = subprocess.run(
        pip_install_command(python, *args),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_fixture(tmp_path_factory.mktemp("plugin_fixture"))


@pytest.fixture(scope="module")
def child_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A child environment with the plugin installed from a copy (the source tree stays clean)."""
    work = tmp_path_factory.mktemp("plugin_env")
    src = work / "plugin"
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    python = make_child_env(work / "venv")
    pip_install(python, str(src), cwd=work)
    return python


# -- without installing: the backend class itself ----------------------------------------------------


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(PLUGIN))
    import parity_example_plugin  # type: ignore[import-not-found]

    return parity_example_plugin


def test_plugin_backend_matches_golden(
    plugin_module: Any, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PARITY_EXAMPLE_PLUGIN_BUG", raising=False)
    fixture: Fixture = load_fixture(fixture_dir)
    backend = plugin_module.ExampleBackend()
    taps = backend.supported_taps(fixture)
    assert "blocks.0.attn.hook_q" not in taps and "blocks.1.hook_resid_mid" in taps
    out = backend.run(fixture, "fp64")
    golden = {c: {t: fixture.golden("fp64")[c][t] for t in taps} for c in out}
    err, where = max_error(out, golden)
    assert err <= 1e-13, where
    assert all(a.dtype == np.float64 for taps_ in out.values() for a in taps_.values())


def test_plugin_bug_moves_positions_only(
    plugin_module: Any, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = load_fixture(fixture_dir)
    monkeypatch.setenv("PARITY_EXAMPLE_PLUGIN_BUG", "1")
    out = plugin_module.ExampleBackend().run(fixture, "fp64")
    diff = np.abs(out["short"]["hook_pos_embed"] - fixture.golden("fp64")["short"]["hook_pos_embed"]).max()
    assert 1e-12 < diff < 1e-6  # wrong in the fp64 tier, invisible in the fp32 tier
    assert np.array_equal(out["short"]["hook_embed"], fixture.golden("fp64")["short"]["hook_embed"])


# -- installed: through the entry point and the CLI --------------------------------------------------


def test_backends_lists_the_plugin(child_python: Path, tmp_path: Path) -> None:
    needs_cli()
    proc = run_harness(child_python, "backends", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.split()[:1] == [NAME]), None)
    assert line is not None, proc.stdout
    assert "fp64" in line and "available" in line and "missing" not in line
    assert any(ln.split()[:1] == ["numpy"] for ln in proc.stdout.splitlines())  # built-ins still there


def test_run_compares_the_plugin(child_python: Path, fixture_dir: Path, tmp_path: Path) -> None:
    needs_cli()
    report = tmp_path / "report.json"
    proc = run_harness(
        child_python,
        "run",
        "--fixture",
        str(fixture_dir),
        "--backends",
        NAME,
        "--precision",
        "all",
        "--json",
        str(report),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["passed"] is True
    rows = [r for r in data["results"] if r["backend"] == NAME]
    assert rows and len(rows) == len(data["results"])
    assert {r["precision"] for r in rows} == {"fp64"}
    assert {r["golden"] for r in rows} == {"fp64", "fp32"}
    statuses = {r["status"] for r in rows}
    assert statuses == {"ok", "not_supported"}
    unsupported = {r["tap"] for r in rows if r["status"] == "not_supported"}
    assert "blocks.0.attn.hook_q" in unsupported and "logits" not in unsupported


def test_check_backend_passes_for_the_plugin(child_python: Path, fixture_dir: Path, tmp_path: Path) -> None:
    needs_cli()
    proc = run_harness(child_python, "check-backend", NAME, "--fixture", str(fixture_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"check-backend {NAME}: OK" in proc.stdout and "FAIL" not in proc.stdout


def test_buggy_plugin_is_caught_at_the_perturbed_tap(
    child_python: Path, fixture_dir: Path, tmp_path: Path
) -> None:
    needs_cli()
    report = tmp_path / "report.json"
    proc = run_harness(
        child_python,
        "run",
        "--fixture",
        str(fixture_dir),
        "--backends",
        NAME,
        "--json",
        str(report),
        cwd=tmp_path,
        env={"PARITY_EXAMPLE_PLUGIN_BUG": "1"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "hook_pos_embed" in proc.stdout
    data = json.loads(report.read_text())
    assert data["passed"] is False
    fails = [r for r in data["results"] if r["status"] == "fail"]
    assert fails and all(r["golden"] == "fp64" for r in fails)  # the fp32 tier cannot see it
    assert {r["case"] for r in fails} == {"short", "longest"}  # T = 1: sin 0 and cos 0 are exact
    assert "hook_pos_embed" in {r["tap"] for r in fails}
    order = load_fixture(fixture_dir).tap_names
    assert min(order.index(r["tap"]) for r in fails) == order.index("hook_pos_embed")
    assert "hook_pos_embed" in json.dumps(data["first_divergence"])
