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

REPO = Path(__file__).resolve().parent.parent
# Set by `nox -s tests` (and so by CI): a skip there means a built-in backend's dependency is
# missing from the environment, which must fail the run instead of hiding a backend.
REQUIRE_ALL = os.environ.get("PARITY_REQUIRE_ALL_BACKENDS") == "1"
TOY = REPO / "fixtures" / "toy"
# A real test vector from another machine: the toy's weights, goldens and ONNX graphs recomputed on AVX-512.
AVX512_VECTOR = REPO / "tests" / "data" / "toy-avx512"


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


@pytest.fixture(scope="session")
def local_toy(tmp_path_factory: pytest.TempPathFactory, toy_dir: Path) -> Path:
    """The toy's weights with goldens recomputed on this machine (read-only; copy it before changing it).

    For the tests that need exact agreement with the reference: the committed goldens were made on
    another platform, which rounds differently, so exactness is only a same-platform claim.
    """
    pytest.importorskip("torch")
    from harness.export import write_fixture
    from harness.fixture import load_fixture

    toy = load_fixture(toy_dir)
    root = tmp_path_factory.mktemp("local") / "toy"
    onnx = {kind: path for kind in ("all_taps", "logits") if (path := toy.onnx_path(kind)) is not None}
    from harness.onnx_decode import decode_graph

    write_fixture(root, toy.weights(), int(toy.manifest["provenance"]["seed"]),
                  int(toy.manifest["provenance"]["steps"]), with_onnx=onnx,  # type: ignore[arg-type]
                  progress=lambda _message: None, decode_onnx=decode_graph(toy))
    return root


@pytest.fixture
def fixture_copy(tmp_path: Path, toy_dir: Path) -> Path:
    """A writable copy of the toy fixture."""
    dst = tmp_path / "toy"
    shutil.copytree(toy_dir, dst)
    return dst


def rehash(root: Path) -> None:
    """Rewrite the manifest's sha256 table after a test changed a file on purpose."""
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["sha256"] = {name: sha256_file(root / name) for name in manifest["sha256"]}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))


def edit_manifest(root: Path, change: Callable[[dict], None], rehash_files: bool = False) -> None:  # type: ignore[type-arg]
    manifest = json.loads((root / MANIFEST).read_text())
    change(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
    if rehash_files:
        rehash(root)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m harness ARGS` in a subprocess, as a user would run it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)
