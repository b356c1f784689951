"""Two real porting bugs of the mutant catalog in a temporary copy of ts_model/model/model.ts, run through the harness.

- Dropping the causal mask fails both tiers, first at the attention scores of block 0.
- Replacing erf by the Abramowitz-Stegun 7.1.26 polynomial (|error| <= 1.5e-7) passes the fp32
  tier and fails the fp64 tier: the reason the fp64 tier exists.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from parity_harness._tools.mutants import by_name
from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


def mutated_ts_dir(tmp_path: Path, mutant: str | None) -> Path:
    """A copy of ts_model/ with the catalog's mutant `mutant` applied (None: an unmutated copy)."""
    dst = tmp_path / "ts_model"
    shutil.copytree(REPO / "ts_model", dst, ignore=shutil.ignore_patterns("tests", "browser", "web"))
    if mutant is not None:
        (m,) = by_name([mutant])
        assert m.target == "typescript"
        m.patch_file(dst)
    return dst


def run_typescript(toy_dir: Path, ts_dir: Path, out: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript", "--json", str(out), "-q",
                   env={"PARITY_TS_DIR": str(ts_dir)})
    return proc.returncode, json.loads(out.read_text()) if out.exists() else {}


def failing_tiers(report: dict) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(r["precision"], r["golden"]) for r in report["results"] if r["status"] == "fail"}


def test_unmutated_copy_passes(toy_dir: Path, tmp_path: Path) -> None:
    ts_dir = mutated_ts_dir(tmp_path, None)
    code, report = run_typescript(toy_dir, ts_dir, tmp_path / "r.json")
    assert code == 0 and report["passed"] is True


def test_dropping_the_causal_mask_fails_both_tiers_at_the_scores(toy_dir: Path, tmp_path: Path) -> None:
    ts_dir = mutated_ts_dir(tmp_path, "ts-no-causal-mask")
    code, report = run_typescript(toy_dir, ts_dir, tmp_path / "r.json")
    assert code == 1
    assert failing_tiers(report) == {("fp64", "fp64"), ("fp64", "fp32")}
    divs = report["first_divergence"]["typescript"]
    assert {d["tap"] for d in divs} == {"blocks.0.attn.hook_attn_scores"}
    # A masked cell that became finite: an infinity mismatch, upstream of it everything agrees.
    assert all("infinity mismatch" in d["message"] for d in divs)
    assert all(d["upstream_max_abs"] <= 1e-5 for d in divs)


def test_polynomial_erf_passes_fp32_and_fails_fp64(toy_dir: Path, tmp_path: Path) -> None:
    ts_dir = mutated_ts_dir(tmp_path, "ts-erf-polynomial")
    code, report = run_typescript(toy_dir, ts_dir, tmp_path / "r.json")
    assert code == 1
    assert failing_tiers(report) == {("fp64", "fp64")}
    divs = report["first_divergence"]["typescript"]
    assert [d["tap"] for d in divs] == ["blocks.0.mlp.hook_post"]
    fp32_rows = [r for r in report["results"] if r["golden"] == "fp32"]
    assert fp32_rows and all(r["passed"] for r in fp32_rows)
