"""The error budget: every result against the float64 truth, absolute and in float32 epsilons."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from parity_harness._compare.budget import EPS32, EPS64, GOLDEN_FP32, format_budget, tap_budget
from parity_reference.taps import tap_names
from tests.helpers import run_cli

pytestmark = pytest.mark.full  # `nox -s full`: not in the fast set (pyproject.toml's markers)


def test_units_are_max_abs_over_eps_times_the_tap_magnitude() -> None:
    truth = {"a": np.array([[4.0, -8.0], [1.0, 0.5]]), "b": np.array([[2.0, 1.0]])}
    actual = {"a": truth["a"] + np.array([[0.0, 0.0], [3 * EPS32, 0.0]]), "b": truth["b"].copy()}
    row = tap_budget("x", "fp32", "t", actual, truth)  # type: ignore[arg-type]
    assert row.status == "ok" and row.magnitude == 8.0 and row.case == "a" and row.index == [1, 0]
    assert row.max_abs == 3 * EPS32
    assert row.eps32_units == 3 * EPS32 / (EPS32 * 8.0)  # 0.375: small next to the tap's largest value
    assert row.eps64_units == 3 * EPS32 / (EPS64 * 8.0)


def test_masked_cells_are_ignored_and_structural_mismatches_fail() -> None:
    scores = np.array([[1.0, -np.inf], [2.0, 16.0]])
    same = tap_budget("x", "fp32", "t", {"c": scores.copy()}, {"c": scores})
    assert same.max_abs == 0.0 and same.eps32_units == 0.0 and same.magnitude == 16.0
    nan = scores.copy()
    nan[1, 0] = np.nan
    bad = tap_budget("y", "fp32", "t", {"c": nan}, {"c": scores})
    assert bad.status == "fail" and bad.max_abs == math.inf and "NaN" in bad.message
    missing = tap_budget("x", "fp32", "t", {"c": None}, {"c": scores})
    assert missing.status == "fail"
    text = "\n".join(format_budget([bad, same], ["t"]))
    row = next(ln for ln in text.splitlines() if ln.startswith("t "))
    assert row.split() == ["t", "1.6e+01", "FAIL", "0"] and "eps32" in text


def test_run_budget_section_and_json_rows(toy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run_cli("run", "--fixture", str(toy_dir), "--backends", "numpy", "-q", "--budget", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Error budget against the float64 truth"))
    assert start > next(i for i, ln in enumerate(lines) if ln.startswith("numpy ") and " vs " in ln)  # after the table
    assert lines[-1].startswith("PASS")
    section = lines[start:]
    taps = tap_names(2)
    fp32_header = next(ln for ln in section if ln.startswith("tap ") and GOLDEN_FP32 in ln)
    assert "numpy" in fp32_header
    assert sum(1 for ln in section if ln.split() and ln.split()[0] == "blocks.1.hook_resid_post") == 2  # fp32, fp64
    report = json.loads(out.read_text())
    rows = report["budget"]
    # The PyTorch float32 golden has its own row for every tap (it is not the truth either), then numpy.
    assert {(r["backend"], r["precision"]) for r in rows} == {(GOLDEN_FP32, "fp32"), ("numpy", "fp32"),
                                                             ("numpy", "fp64")}
    assert len(rows) == 3 * len(taps)
    by = {(r["backend"], r["precision"], r["tap"]): r for r in rows}
    for tap in taps:
        g32, n32, n64 = by[(GOLDEN_FP32, "fp32", tap)], by[("numpy", "fp32", tap)], by[("numpy", "fp64", tap)]
        for r in (g32, n32, n64):
            assert r["status"] == "ok"
            assert r["eps32_units"] == (0.0 if r["max_abs"] == 0 else r["max_abs"] / (EPS32 * r["magnitude"]))
        # float32 results are float32 round-off away from the truth; float64 ones a few float64 epsilons.
        assert n32["max_abs"] < 100 * EPS32 * n32["magnitude"]
        assert n64["max_abs"] < 100 * EPS64 * n64["magnitude"]
        assert n64["max_abs"] <= max(n32["max_abs"], 1e-15)
    # The row that matters for the fp32 tolerance: the residual stream at the end, magnitude ~27.
    resid = by[(GOLDEN_FP32, "fp32", "blocks.1.hook_resid_post")]
    assert 10 < resid["magnitude"] < 100 and 0 < resid["max_abs"] < 1e-5
