"""The CI gate: a full `parity run` over every built-in backend on each committed fixture.

It fails if any built-in backend is skipped (missing dependency), not supported where it should
be, or disagrees on any tap of any case in any tier it computes in, on fixtures/toy or on
fixtures/toy-stress (the numerically hard one, harness/stress.py).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

BUILTIN_PRECISIONS = {
    "pytorch": {"fp32", "fp64"},
    "numpy": {"fp32", "fp64"},
    "onnxruntime": {"fp32"},
    "onnxruntime-optimized": {"fp32"},
    "onnx-reference": {"fp32"},
    "typescript": {"fp64"},
}


def builtin_backends() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    eps = pyproject["project"]["entry-points"]["parity.backends"]
    return {name for name, target in eps.items() if target.startswith("harness.backends.")}


def test_every_builtin_backend_is_registered_and_listed_here() -> None:
    assert builtin_backends() == set(BUILTIN_PRECISIONS)


@pytest.mark.parametrize("fixture_name", ["toy", "toy-stress"])
def test_full_parity_run_every_builtin_backend_agrees(fixture_name: str, tmp_path: Path) -> None:
    toy_dir = REPO / "fixtures" / fixture_name
    out = tmp_path / "report.json"
    names = ",".join(sorted(BUILTIN_PRECISIONS))
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", names, "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["passed"] is True
    ran = {(r["backend"], r["precision"]) for r in report["runs"] if r["status"] == "ran"}
    assert ran == {(b, p) for b, ps in BUILTIN_PRECISIONS.items() for p in ps}
    # Every backend compared every tap it supports in every case, in each of its tiers.
    manifest = json.loads((toy_dir / "manifest.json").read_text())
    n_cases = len(manifest["cases"])
    for backend, precisions in BUILTIN_PRECISIONS.items():
        rows = [r for r in report["results"] if r["backend"] == backend and r["status"] == "ok"]
        tiers = {(r["precision"], r["golden"]) for r in rows}
        expected_tiers = {("fp32", "fp32")} if "fp32" in precisions else set()
        if "fp64" in precisions:
            expected_tiers |= {("fp64", "fp64"), ("fp64", "fp32")}
        assert tiers == expected_tiers, backend
        taps = {r["tap"] for r in rows}
        assert len(rows) == len(tiers) * len(taps) * n_cases
        if backend == "onnxruntime-optimized":
            assert taps == {"logits", "probs"}
        else:
            assert taps == {t["name"] for t in manifest["taps"]}, backend
    fp64 = [r for r in report["results"] if r["golden"] == "fp64"]
    tol = manifest["tolerances"]["fp64"]
    assert fp64 and all(r["max_abs"] <= tol["overrides"].get(r["tap"], tol)["atol"] for r in fp64)
