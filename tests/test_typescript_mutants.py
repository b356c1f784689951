"""Two real porting bugs in a temporary copy of model.ts, run through the harness (issue 5's acceptance).

- Dropping the causal mask fails both tiers, first at the attention scores of block 0.
- Replacing erf by the Abramowitz-Stegun 7.1.26 polynomial (|error| <= 1.5e-7) passes the fp32
  tier and fails the fp64 tier: the reason the fp64 tier exists.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import REPO, run_cli

MASK = "config.causal && j > i ? -Infinity : dot / rootDh"
GELU = "out.data[i] = 0.5 * v * (1.0 + erf(v / Math.SQRT2));"
POLY_ERF = """const erfPoly = (x: number): number => {
  // Abramowitz-Stegun 7.1.26: |error| <= 1.5e-7, the approximation ports often use.
  const s = x < 0 ? -1 : 1;
  const a = Math.abs(x);
  const t = 1 / (1 + 0.3275911 * a);
  const y = 1 - ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592)
    * t * Math.exp(-a * a);
  return s * y;
};
"""


def mutated_ts_dir(tmp_path: Path, old: str, new: str, prelude: str = "") -> Path:
    dst = tmp_path / "ts_model"
    shutil.copytree(REPO / "ts_model", dst, ignore=shutil.ignore_patterns("tests"))
    source = (dst / "model.ts").read_text()
    assert source.count(old) == 1, f"anchor not found exactly once in model.ts: {old!r}"
    source = source.replace(old, new)
    if prelude:
        marker = "/** The exact GELU"
        assert source.count(marker) == 1
        source = source.replace(marker, prelude + marker)
    (dst / "model.ts").write_text(source)
    return dst


def run_typescript(toy_dir: Path, ts_dir: Path, out: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "typescript", "--json", str(out), "-q",
                   env={"PARITY_TS_DIR": str(ts_dir)})
    return proc.returncode, json.loads(out.read_text()) if out.exists() else {}


def failing_tiers(report: dict) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(r["precision"], r["golden"]) for r in report["results"] if r["status"] == "fail"}


def test_unmutated_copy_passes(toy_dir: Path, tmp_path: Path) -> None:
    ts_dir = mutated_ts_dir(tmp_path, MASK, MASK)
    code, report = run_typescript(toy_dir, ts_dir, tmp_path / "r.json")
    assert code == 0 and report["passed"] is True


def test_dropping_the_causal_mask_fails_both_tiers_at_the_scores(toy_dir: Path, tmp_path: Path) -> None:
    ts_dir = mutated_ts_dir(tmp_path, MASK, "dot / rootDh")
    code, report = run_typescript(toy_dir, ts_dir, tmp_path / "r.json")
    assert code == 1
    assert failing_tiers(report) == {("fp64", "fp64"), ("fp64", "fp32")}
    divs = report["first_divergence"]["typescript"]
    assert {d["tap"] for d in divs} == {"blocks.0.attn.hook_attn_scores"}
    # A masked cell that became finite: an infinity mismatch, upstream of it everything agrees.
    assert all("infinity mismatch" in d["message"] for d in divs)
    assert all(d["upstream_max_abs"] <= 1e-5 for d in divs)


def test_polynomial_erf_passes_fp32_and_fails_fp64(toy_dir: Path, tmp_path: Path) -> None:
    ts_dir = mutated_ts_dir(tmp_path, GELU, "out.data[i] = 0.5 * v * (1.0 + erfPoly(v / Math.SQRT2));",
                            prelude=POLY_ERF)
    code, report = run_typescript(toy_dir, ts_dir, tmp_path / "r.json")
    assert code == 1
    assert failing_tiers(report) == {("fp64", "fp64")}
    divs = report["first_divergence"]["typescript"]
    assert [d["tap"] for d in divs] == ["blocks.0.mlp.hook_post"]
    fp32_rows = [r for r in report["results"] if r["golden"] == "fp32"]
    assert fp32_rows and all(r["passed"] for r in fp32_rows)
