"""Shared pytest fixtures: the committed toy fixture, writable copies of it, and a CLI runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.fixture import MANIFEST, sha256_file
from harness.manifest import manifest_digest

REPO = Path(__file__).resolve().parent.parent
# Set by `nox -s tests` (and so by CI): a skip there means a built-in backend's dependency is
# missing from the environment, which must fail the run instead of hiding a backend.
REQUIRE_ALL = os.environ.get("PARITY_REQUIRE_ALL_BACKENDS") == "1"
TOY = REPO / "fixtures" / "toy"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """With PARITY_REQUIRE_ALL_BACKENDS=1, a skipped test is a failed test, its reason kept."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and call.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under PARITY_REQUIRE_ALL_BACKENDS=1 (CI must not skip): {reason}"


@pytest.fixture(scope="session")
def toy_dir() -> Path:
    """The committed fixture (read-only: copy it before changing anything)."""
    assert (TOY / MANIFEST).is_file(), "fixtures/toy is missing: run `nox -s fixtures`"
    return TOY


@pytest.fixture
def fixture_copy(tmp_path: Path, toy_dir: Path) -> Path:
    """A writable copy of the toy fixture."""
    dst = tmp_path / "toy"
    shutil.copytree(toy_dir, dst)
    return dst


def reseal(root: Path, manifest: dict, rehash_files: bool = False) -> None:  # type: ignore[type-arg]
    """Write `manifest` with its sha256 table (if `rehash_files`) and its seal recomputed, unchecked."""
    if rehash_files:
        manifest["sha256"] = {name: sha256_file(root / name) for name in manifest["sha256"]}
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def rehash(root: Path) -> None:
    """Rewrite the manifest's sha256 table and seal after a test changed a file on purpose."""
    reseal(root, json.loads((root / MANIFEST).read_text()), rehash_files=True)


def edit_manifest(root: Path, change: Callable[[dict], object], rehash_files: bool = False,  # type: ignore[type-arg]
                  seal: bool = True) -> None:
    """Change the manifest, re-sealed (as a reviewed edit would be) unless `seal` is False."""
    manifest = json.loads((root / MANIFEST).read_text())
    change(manifest)
    if seal:
        reseal(root, manifest, rehash_files)
    else:
        (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m harness ARGS` in a subprocess, as a user would run it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)
