"""The comparison rules of docs/spec.md (section 3), one behaviour per test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parity_harness._compare.judge import CheckResult, compare_tensors, first_divergence, summarize_tap
from parity_harness._core.status import Status

F32 = np.float32


def arr(*values: float, dtype: type = F32) -> np.ndarray:
    return np.array(values, dtype=dtype)


def test_identical_tensors_pass_with_zero_error() -> None:
    a = arr(1.0, -2.0, 3.5)
    cmp = compare_tensors(a, a.copy(), atol=1e-5, rtol=0.0)
    assert cmp.passed and cmp.max_abs == 0.0 and cmp.min_atol == 0.0 and cmp.n_bad == 0


def test_atol_boundary_is_inclusive_and_breach_fails() -> None:
    b = np.zeros(3)
    assert compare_tensors(np.array([0.0, 0.5e-5, 1e-5]), b, atol=1e-5, rtol=0.0).passed
    cmp = compare_tensors(np.array([0.0, 2e-5, 1e-6]), b, atol=1e-5, rtol=0.0)
    assert not cmp.passed
    assert cmp.index == [1] and cmp.actual == pytest.approx(2e-5) and cmp.expected == 0.0
    assert cmp.min_atol == pytest.approx(2e-5) and cmp.n_bad == 1


def test_rtol_scales_with_the_golden_magnitude() -> None:
    b = np.array([1000.0, 1.0])
    a = b + np.array([5e-3, 5e-3])
    # 5e-3 <= 0 + 1e-5 * 1000 passes at the large cell and fails at the small one.
    cmp = compare_tensors(a, b, atol=0.0, rtol=1e-5)
    assert not cmp.passed and cmp.index == [1] and cmp.n_bad == 1
    assert compare_tensors(a, b, atol=5e-3, rtol=1e-5).passed
    # min_atol is the atol needed with the same rtol: the small cell needs 5e-3 - 1e-5.
    assert cmp.min_atol == pytest.approx(5e-3 - 1e-5)


def test_max_rel_is_guarded_near_zero() -> None:
    cmp = compare_tensors(np.array([1e-9]), np.array([0.0]), atol=1e-5, rtol=0.0)
    assert cmp.passed and math.isfinite(cmp.max_rel) and cmp.max_rel == pytest.approx(1e-4)


@pytest.mark.parametrize("side", ["candidate", "golden"])
def test_nan_on_either_side_fails(side: str) -> None:
    good = arr(1.0, 2.0)
    bad = arr(1.0, float("nan"))
    a, b = (bad, good) if side == "candidate" else (good, bad)
    cmp = compare_tensors(a, b, atol=1.0, rtol=1.0)
    assert not cmp.passed and f"NaN in the {side}" in cmp.message and cmp.index == [1]


def test_nan_on_both_sides_still_fails() -> None:
    nan = arr(float("nan"))
    assert not compare_tensors(nan, nan.copy(), atol=1.0, rtol=1.0).passed


def test_matching_infinities_agree() -> None:
    scores = arr(0.5, -math.inf, -math.inf)
    cmp = compare_tensors(scores + F32(1e-7), scores.copy(), atol=1e-5, rtol=0.0)
    assert cmp.passed and cmp.max_abs == pytest.approx(1e-7, rel=0.5)


@pytest.mark.parametrize(
    ("actual", "expected"),
    [(-math.inf, math.inf), (-math.inf, 0.0), (0.0, -math.inf), (1e30, math.inf)],
)
def test_infinity_mismatches_fail(actual: float, expected: float) -> None:
    cmp = compare_tensors(np.array([1.0, actual]), np.array([1.0, expected]), atol=1e300, rtol=1.0)
    assert not cmp.passed and "infinity mismatch at [1]" in cmp.message


def test_shape_mismatch_fails_with_both_shapes() -> None:
    cmp = compare_tensors(np.zeros((2, 3)), np.zeros((3, 2)), atol=1.0, rtol=0.0)
    assert not cmp.passed and "[2, 3]" in cmp.message and "[3, 2]" in cmp.message


def test_dtype_mismatch_fails() -> None:
    cmp = compare_tensors(np.zeros(3, np.float64), np.zeros(3, np.float32), atol=1.0, rtol=0.0)
    assert not cmp.passed and "float64" in cmp.message and "float32" in cmp.message


def test_empty_tensors_of_the_same_shape_pass_and_of_another_shape_fail() -> None:
    assert compare_tensors(np.zeros((0, 4), F32), np.zeros((0, 4), F32), 1e-5, 0.0).passed
    assert not compare_tensors(np.zeros((0, 4), F32), np.zeros((0, 3), F32), 1e-5, 0.0).passed


def test_worst_cell_is_the_worst_breach_not_the_largest_difference() -> None:
    b = np.array([1000.0, 0.0])
    a = np.array([1000.5, 2e-3])  # 0.5 is allowed by rtol at the big cell; 2e-3 breaks atol at 0
    cmp = compare_tensors(a, b, atol=1e-3, rtol=1e-3)
    assert not cmp.passed and cmp.index == [1] and cmp.max_abs == pytest.approx(0.5)


def _result(case: str, tap: str, passed: bool, max_abs: float) -> CheckResult:
    return CheckResult("b", "fp32", "fp32", case, tap, Status.OK if passed else Status.FAIL, passed, 1e-5, 0.0,
                       max_abs, max_abs, max_abs, [0], 1.0, 1.0 + max_abs)


def test_first_divergence_follows_dataflow_order_and_reports_upstream() -> None:
    order = ["a", "b", "c"]
    results = [
        _result("x", "a", True, 1e-7), _result("x", "b", True, 2e-7), _result("x", "c", False, 1e-3),
        _result("y", "a", True, 3e-7), _result("y", "b", False, 5e-4), _result("y", "c", False, 1e-2),
    ]
    div = first_divergence(results, order)
    assert div is not None and div.tap == "b" and div.case == "y"
    assert div.upstream_taps == 1 and div.upstream_max_abs == pytest.approx(3e-7)
    assert div.by_case == {"x": "c", "y": "b"}
    assert first_divergence([r for r in results if r.passed], order) is None


def test_tap_summary_is_the_worst_case() -> None:
    s = summarize_tap([_result("x", "a", True, 1e-7), _result("y", "a", False, 1e-3)])
    assert s.passed is False and s.n_failed == 1 and s.n_cases == 2 and s.worst_case == "y"
    assert s.max_abs == pytest.approx(1e-3)
