"""The comparison rules of docs/spec.md (section 3), one behaviour per test; then the fast judge against its oracle.

The oracle is the judge as it was written first (whole-array NumPy, a temporary per step), kept here
verbatim: `compare_tensors`, `coarser_grid_message` and `judge_tensor` must give field for field the
same results on random inputs with NaN, infinities (matched and not), signed zeros, overflowing
differences, atol 0, 0-d to 3-d shapes over several of the fast path's slices, float32 and float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import numpy as np
import pytest

from parity_harness._compare.judge import (
    COARSER_GRIDS,
    MIN_GRID_CANDIDATES,
    CheckResult,
    TensorComparison,
    coarser_grid_message,
    compare_tensors,
    first_divergence,
    judge_tensor,
    max_abs_error,
    summarize_tap,
)
from parity_harness._core.precision import DTYPES, MAX_FINITE, Precision, is_reduced, on_grid
from parity_harness._core.status import Status
from tests.helpers import round_bf16 as _bf16
from tests.helpers import round_fp16 as _fp16

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


# --- The oracle: the judge as it was before its fast path (whole-array NumPy, one temporary per step),
# --- kept verbatim as the plain reference the fast `compare_tensors`, `coarser_grid_message` and
# --- `judge_tensor` must agree with, field by field, on every input.

def _oracle_cell(x: np.ndarray, index: tuple[int, ...]) -> float:
    return float(x[index]) if x.ndim else float(x)


def oracle_compare_tensors(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> TensorComparison:
    if not isinstance(actual, np.ndarray):
        return TensorComparison(False, math.inf, math.inf, math.inf, message=f"not an array ({type(actual).__name__})")
    if actual.shape != expected.shape:
        return TensorComparison(
            False, math.inf, math.inf, math.inf,
            message=f"shape {list(actual.shape)} != expected {list(expected.shape)}",
        )
    if actual.dtype != expected.dtype:
        return TensorComparison(
            False, math.inf, math.inf, math.inf, message=f"dtype {actual.dtype} != expected {expected.dtype}"
        )
    if actual.size == 0:
        return TensorComparison(True)
    a = actual.astype(np.float64)
    b = expected.astype(np.float64)
    for side, x in (("candidate", a), ("golden", b)):
        nan = np.isnan(x)
        if nan.any():
            idx = tuple(int(i) for i in np.argwhere(nan)[0])
            return TensorComparison(
                False, math.inf, math.inf, math.inf, list(idx), _oracle_cell(a, idx), _oracle_cell(b, idx),
                int(nan.sum()), f"NaN in the {side} at {list(idx)}",
            )
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    inf_mismatch = (inf_a | inf_b) & ~(inf_a & inf_b & (np.sign(a) == np.sign(b)))
    if inf_mismatch.any():
        idx = tuple(int(i) for i in np.argwhere(inf_mismatch)[0])
        return TensorComparison(
            False, math.inf, math.inf, math.inf, list(idx), _oracle_cell(a, idx), _oracle_cell(b, idx),
            int(inf_mismatch.sum()),
            f"infinity mismatch at {list(idx)}: {_oracle_cell(a, idx)} vs {_oracle_cell(b, idx)}",
        )
    finite = ~inf_b
    diff = np.abs(np.subtract(a, b, out=np.zeros_like(a), where=finite))  # 0 at matching infinities
    abs_b = np.abs(np.where(finite, b, 0.0))
    allowed = atol + rtol * abs_b
    excess = diff - allowed  # > 0 where a cell breaks tolerance
    bad = excess > 0
    guard = atol if atol > 0 else float(np.finfo(expected.dtype).tiny)
    with np.errstate(over="ignore"):  # a huge error over a tiny guard is inf: the right answer
        rel = diff / np.maximum(abs_b, guard)
    worst = np.unravel_index(int(np.argmax(excess if bad.any() else diff)), diff.shape)
    idx = tuple(int(i) for i in worst)
    return TensorComparison(
        passed=not bad.any(),
        max_abs=float(diff.max()),
        max_rel=float(rel.max()),
        min_atol=float(np.maximum(diff - rtol * abs_b, 0.0).max()),
        index=list(idx),
        actual=_oracle_cell(a, idx),
        expected=_oracle_cell(b, idx),
        n_bad=int(bad.sum()),
    )


def oracle_coarser_grid_message(actual: np.ndarray, expected: np.ndarray, precision: str) -> tuple[str, int] | None:
    declared = expected.astype(np.float16 if precision == "fp16" else np.float32).astype(np.float32)
    finite = np.isfinite(actual)
    for grid, bits in COARSER_GRIDS.get(precision, ()):
        candidates = np.isfinite(declared) & ~on_grid(declared, grid) & finite
        n = int(candidates.sum())
        if n >= MIN_GRID_CANDIDATES and bool(on_grid(actual[candidates], grid).all()):
            return (f"precision: all {n} values carry at most {bits} significant bits ({grid}'s grid) where "
                    f"{precision} was declared: computed in {grid}", n)
    return None


def oracle_overflow_message(actual: np.ndarray, expected: np.ndarray,
                            precision: Precision) -> tuple[str, tuple[int, ...], int] | None:
    gone = ~np.isfinite(actual) & np.isfinite(expected)
    if not gone.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(gone)[0])
    a, b = _oracle_cell(actual, idx), _oracle_cell(expected, idx)
    what = "the value itself" if math.isinf(a) else "an intermediate of this tap (inf - inf or inf x 0 gave NaN)"
    return (f"overflow: {a} at {list(idx)} where the golden is {b:.6g}: {what} left the {precision} range "
            f"(largest finite {MAX_FINITE[precision]:.6g}); {int(gone.sum())} such cells", idx, int(gone.sum()))


def oracle_judge_tensor(
    backend: str, precision: str, golden: str, case: str, tap: str, actual: np.ndarray | None,
    expected: np.ndarray, atol: float, rtol: float, step: int | None = None,
) -> CheckResult:
    FAIL, OK = Status.FAIL, Status.OK
    if actual is None:
        return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, step=step,
                           message="missing: the backend declares this tap but did not return it")
    if is_reduced(precision):
        container = np.dtype(DTYPES[cast(Precision, precision)])
        if isinstance(actual, np.ndarray) and actual.dtype == container and actual.shape == expected.shape:
            overflow = oracle_overflow_message(actual, expected, cast(Precision, precision))
            if overflow is not None:
                message, idx, n = overflow
                return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, math.inf, math.inf,
                                   math.inf, list(idx), _oracle_cell(actual, idx), _oracle_cell(expected, idx),
                                   message, n, step, int(expected.size))
        elif isinstance(actual, np.ndarray) and actual.dtype != container:
            return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, math.inf, math.inf,
                               math.inf, message=f"dtype {actual.dtype} != expected {container} ({precision} results "
                               f"are {container} arrays holding {precision} values)", step=step)
    grid = None
    if (precision in COARSER_GRIDS and isinstance(actual, np.ndarray) and actual.dtype == np.float32
            and actual.shape == expected.shape and not np.isnan(actual).any()):
        grid = oracle_coarser_grid_message(actual, expected, precision)
    if is_reduced(precision):
        if isinstance(actual, np.ndarray) and actual.dtype == np.float32:
            actual = actual.astype(np.float64)
        expected = expected.astype(np.float64)
    elif golden != precision:
        expected = expected.astype(np.float64)
    cmp = oracle_compare_tensors(actual, expected, atol, rtol)
    if grid is not None and not cmp.message:
        message, n = grid
        return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, cmp.max_abs, cmp.max_rel,
                           cmp.min_atol, cmp.index, cmp.actual, cmp.expected, message, n, step, int(expected.size))
    return CheckResult(  # n_cells: the golden's size once the tensors were compared
        backend, precision, golden, case, tap, OK if cmp.passed else FAIL, cmp.passed, atol, rtol,
        cmp.max_abs, cmp.max_rel, cmp.min_atol, cmp.index, cmp.actual, cmp.expected, cmp.message, cmp.n_bad, step,
        int(np.size(expected)),
    )


# --- Random inputs, and field-by-field equality (NaN equals NaN; 0.0 and -0.0 differ; types must match).

SMALL_SHAPES: list[tuple[int, ...]] = [(), (1,), (7,), (0,), (3, 0, 2), (2, 3, 4), (5, 17, 11), (4097,)]
# Over one slice of the fast path (65,536 cells): the worst cell, ties and infinities in a later slice.
LARGE_SHAPES: list[tuple[int, ...]] = [(70_000,), (2, 300, 250), (3, 1, 65_536)]
ATOLS = [0.0, 0.0, 1e-12, 1e-5, 1e-3, 0.5]
RTOLS = [0.0, 0.0, 1e-5, 1e-2, 1.0, 3.0, math.inf]


@np.errstate(all="ignore")  # inf * 0, float64 beyond float32: the inputs are meant to be hostile
def _pair(rng: np.random.Generator, shape: tuple[int, ...], dtype: type,
          atol: float = 1e-5, rtol: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """A golden and a candidate near it, with what the rules single out planted at random cells: NaN,
    infinities, signed zeros, huge values, zeros against tiny errors, errors on the tolerance's edge."""
    scale = 10.0 ** rng.uniform(-4, 4)
    b = rng.standard_normal(shape) * scale
    if rng.random() < 0.3:  # few distinct values: ties for the largest error, within and across slices
        b = np.round(b / scale * 2) / 2 * scale
    noise = [0.0, 1e-8, 1e-6, 1e-4, 1e-2][rng.integers(5)]
    a = b + rng.standard_normal(shape) * noise * scale
    if rng.random() < 0.3:
        a = np.round(a / scale * 4) / 4 * scale
    a, b = np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)
    big = float(np.finfo(dtype).max)
    n = a.size
    if n:
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)  # views: shapes here are contiguous
        for _ in range(int(rng.integers(0, 4))):
            i = rng.integers(n, size=int(rng.integers(1, 4)))
            kind = int(rng.integers(12))
            if kind == 0:
                flat_a[i] = np.nan
            elif kind == 1:
                flat_b[i] = np.nan
            elif kind == 2:  # masked attention: the same infinity on both sides
                flat_a[i] = flat_b[i] = -np.inf if rng.random() < 0.7 else np.inf
            elif kind == 3:  # the wrong infinity, or an infinity against a finite value
                flat_a[i], flat_b[i] = (np.inf, -np.inf) if rng.random() < 0.5 else (np.inf, 1.0)
            elif kind == 4:
                flat_b[i] = np.inf
            elif kind == 5:  # signed zeros on either side
                flat_a[i], flat_b[i] = (-0.0, 0.0) if rng.random() < 0.5 else (0.0, -0.0)
            elif kind == 6:
                flat_a[i] = flat_b[i] = 0.0
            elif kind == 7:  # huge values: a float64 a - b that overflows to inf
                flat_a[i], flat_b[i] = big, -big
            elif kind == 8:
                flat_a[i], flat_b[i] = big, big * 0.5
            elif kind == 9:  # a golden 0 against a tiny error: max_rel's guard decides
                flat_b[i], flat_a[i] = 0.0, rng.choice([1e-30, 1e-40, 1e-310, 3e-3])
            elif kind == 10:
                flat_a[i] = flat_b[i] * (1 + 1e-3)
            else:  # errors on the tolerance's edge, many of them: its rounding decides the verdict and the worst
                j = rng.integers(n, size=min(n, 64))
                edge = atol + rtol * np.abs(flat_b[j].astype(np.float64))
                flat_a[j] = flat_b[j] + edge * rng.choice([1.0, 1.0 - 2**-52, 1.0 + 2**-52], size=j.size)
    return a, b


def _same(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)
    return type(x) is type(y) and x == y


def _differences(got: object, want: object) -> list[str]:
    """The fields of two dataclass instances that differ, as `name: got != want`."""
    g, w = dataclasses.asdict(got), dataclasses.asdict(want)  # type: ignore[call-overload]
    return [f"{k}: {g[k]!r} != {w[k]!r}" for k in w if not _same(g[k], w[k])]


def _tolerances(rng: np.random.Generator) -> tuple[float, float]:
    return ATOLS[rng.integers(len(ATOLS))], RTOLS[rng.integers(len(RTOLS))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("large", [False, True])
def test_compare_tensors_agrees_with_the_oracle(dtype: type, large: bool) -> None:
    rng = np.random.default_rng(1 + large + 2 * (dtype is np.float64))
    shapes = LARGE_SHAPES if large else SMALL_SHAPES
    for trial in range(40 if large else 600):
        shape = shapes[trial % len(shapes)]
        atol, rtol = _tolerances(rng)
        a, b = _pair(rng, shape, dtype, atol, rtol)
        with np.errstate(all="ignore"):
            want = oracle_compare_tensors(a, b, atol, rtol)
        got = compare_tensors(a, b, atol, rtol)
        assert not _differences(got, want), (trial, shape, atol, rtol, _differences(got, want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("large", [False, True])
def test_max_abs_error_is_what_the_budget_read_of_the_oracle(dtype: type, large: bool) -> None:
    """The budget's question (a result against the float64 truth, judged in float64 at atol = rtol = 0):
    max_abs, the worst cell and the structural message, as the whole comparison gives them."""
    rng = np.random.default_rng(11 + large + 2 * (dtype is np.float64))
    shapes = LARGE_SHAPES if large else SMALL_SHAPES
    for trial in range(40 if large else 600):
        shape = shapes[trial % len(shapes)]
        a, b = _pair(rng, shape, dtype, *_tolerances(rng))
        truth = b.astype(np.float64)
        if trial % 7 == 3 and a.ndim and a.shape[0] > 1:
            a = a[1:]  # a shape mismatch
        with np.errstate(all="ignore"):
            want = oracle_compare_tensors(a.astype(np.float64), truth, 0.0, 0.0)
        got = max_abs_error(a, truth)
        assert (got.message, got.index) == (want.message, want.index), (trial, shape)
        assert _same(got.max_abs, want.max_abs), (trial, shape, got.max_abs, want.max_abs)
    assert max_abs_error(np.zeros(3), np.zeros(3, np.float32)).message == "dtype float64 != expected float32"


def test_compare_tensors_agrees_on_layouts_and_other_dtypes() -> None:
    """Non-contiguous views, float16, integers (atol 0: finfo refuses them, as it did), mismatches."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        atol, rtol = _tolerances(rng)
        a, b = _pair(rng, (6, 5, 4), np.float64, atol, rtol)
        with np.errstate(all="ignore"):  # casts of huge values and NaN
            variants: list[tuple[np.ndarray, np.ndarray]] = [
                (a.transpose(2, 0, 1), b.transpose(2, 0, 1)), (a[:, ::2], b[:, ::2]), (a[1], b[1]),
                (a.astype(np.float16), b.astype(np.float16)), (a.astype(np.float32), b), (a.reshape(20, 6), b),
                (np.round(a).clip(-9, 9).astype(np.int64), np.round(b).clip(-9, 9).astype(np.int64)),
            ]
        for x, y in variants:
            with np.errstate(all="ignore"):
                try:
                    want: TensorComparison | str = oracle_compare_tensors(x, y, atol, rtol)
                except ValueError as exc:
                    want = f"ValueError: {exc}"
                try:
                    got: TensorComparison | str = compare_tensors(x, y, atol, rtol)
                except ValueError as exc:
                    got = f"ValueError: {exc}"
            if isinstance(want, str) or isinstance(got, str):
                assert got == want, trial
            else:
                assert not _differences(got, want), (trial, x.dtype, x.shape, _differences(got, want))


@np.errstate(all="ignore")
def _grid_case(rng: np.random.Generator, precision: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A golden and a float32 result of `precision`: honest, on a coarser grid, or coarse in part."""
    golden = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)
    if rng.random() < 0.3:  # mostly cells that are never candidates: zeros and ones
        golden[rng.random(n) < 0.9] = rng.choice([0.0, 1.0])
    if rng.random() < 0.2:
        golden[rng.integers(n, size=3)] = rng.choice([np.inf, -np.inf, np.nan, 1e6])
    golden = golden.astype(np.float64 if precision == "fp16" and rng.random() < 0.5 else np.float32)
    honest = golden.astype(np.float16 if precision == "fp16" else np.float32).astype(np.float32)
    coarse = [_bf16(honest), _fp16(honest)][rng.integers(2 if precision == "fp32" else 1)]
    kind = int(rng.integers(6))
    if kind == 0:
        actual = honest
    elif kind == 1:
        actual = coarse
    elif kind == 2:  # coarse over the first cells, honest after: the prefix does not decide
        cut = int(rng.integers(n + 1))
        actual = np.concatenate([coarse[:cut], honest[cut:]])
    elif kind == 3:  # coarse but for a few honest cells anywhere
        actual = coarse.copy()
        i = rng.integers(n, size=int(rng.integers(1, 3)))
        actual[i] = honest[i]
    elif kind == 4:
        actual = coarse.copy()
        actual[rng.integers(n, size=2)] = rng.choice([np.inf, -np.inf, np.nan])
    else:  # coarse, and off every grid where the golden is on it (not candidates: they clear nothing)
        actual = coarse.copy()
        i = rng.integers(min(n, 5000), size=int(rng.integers(1, 20)))
        golden[i] = 1.0
        actual[i] = 1.0 + 2.0**-20
    return actual.astype(np.float32), golden


@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp64", "bf16"])
def test_coarser_grid_message_agrees_with_the_oracle(precision: str) -> None:
    rng = np.random.default_rng(len(precision) + ord(precision[-1]))
    fired = 0
    for trial in range(300):
        n = [1, 20, 500, 4096, 4097, 6000, 30_000][trial % 7]
        actual, golden = _grid_case(rng, precision, n)
        shape = (3, n // 3) if n % 3 == 0 else (n,)
        actual, golden = actual.reshape(shape), golden.reshape(shape)
        with np.errstate(over="ignore"):  # a golden beyond fp16's range, rounded to fp16
            want = oracle_coarser_grid_message(actual, golden, precision)
            assert coarser_grid_message(actual, golden, precision) == want, (trial, n)
        fired += want is not None
    assert fired > 20 or precision in ("fp64", "bf16")  # both answers were seen


def _judge_candidate(rng: np.random.Generator, kind: int, a: np.ndarray, b: np.ndarray, precision: str,
                     container: type) -> object:
    """A backend's answer for `judge_tensor`: near the golden, on a grid (declared or coarser), of the wrong
    dtype or shape, missing, or not an array."""
    if precision in ("fp16", "fp32") and kind < 3:  # on a grid: the declared one or a coarser
        if precision == "fp32" and kind == 2:
            return b.astype(np.float32)
        return [_fp16, _bf16, _fp16][kind](b.astype(np.float32))
    if precision == "bf16" and kind < 3:
        return _bf16(b.astype(np.float32))
    if kind == 3:
        return a.astype(np.float64 if container is np.float32 else np.float32)  # the wrong dtype
    if kind == 4 and a.ndim:
        return a[:-1].astype(container)  # the wrong shape
    if kind == 5:
        return None if rng.random() < 0.5 else [0.0]
    return a.astype(container)


@pytest.mark.parametrize(("precision", "golden"), [("fp32", "fp32"), ("fp64", "fp64"), ("fp64", "fp32"),
                                                   ("fp16", "fp64"), ("fp16", "fp32"), ("bf16", "fp32")])
def test_judge_tensor_agrees_with_the_oracle(precision: str, golden: str) -> None:
    rng = np.random.default_rng(sum(map(ord, precision + golden)))
    golden_dtype = np.float32 if golden == "fp32" else np.float64
    container = np.float64 if precision == "fp64" else np.float32
    for trial in range(300):
        shape = [(), (9,), (2, 3, 4), (4200,), (0,)][trial % 5]
        atol, rtol = _tolerances(rng)
        a, expected = _pair(rng, shape, golden_dtype, atol, rtol)
        kind = int(rng.integers(8))
        with np.errstate(all="ignore"):
            actual = _judge_candidate(rng, kind, a, expected, precision, container)
            want = oracle_judge_tensor("b", precision, golden, "case", "tap", actual,  # type: ignore[arg-type]
                                       expected, atol, rtol, None if trial % 2 else 3)
            got = judge_tensor("b", precision, golden, "case", "tap", actual,  # type: ignore[arg-type]
                               expected, atol, rtol, None if trial % 2 else 3)
        assert not _differences(got, want), (trial, kind, shape, atol, rtol, _differences(got, want))
