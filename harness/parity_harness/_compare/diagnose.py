"""Diagnosis: name the likely cause of a first divergence from the numbers themselves.

`diagnose` looks at one failing tensor (the candidate's, the golden's, and where the caller has them the
float64 truth, the float32 golden and the golden of the tap before it) and returns the names of the
patterns that explain its failing cells, most specific first (docs/diagnosis.md):

- ROUNDED_F32: in the fp64 tier, every failing cell is exactly the expected value rounded to float32
  (float64 weights or a float64 tap went through float32 somewhere);
- NOT_CORRECTLY_ROUNDED: against the float64 truth, a failing cell is more than 0.5 eps32 units off
  (eps32 x |truth|) where the float32 golden is within 0.5, and every failing cell is within
  ROUNDING_SIZED units (a rounding-sized error, such as sin/cos computed in float32, not a wrong value);
- SHIFTED: along the position axis, the failing cells hold the expected values of the next or the
  previous position (an off-by-one position);
- SIGN_FLIPPED: every failing cell is the expected value negated;
- MISSING_MASK: the expected tensor holds -inf (a masked score) where the candidate is finite;
- PREVIOUS_TAP: the candidate equals, within tolerance, the golden of the tap before it in dataflow
  order (a hook placed one step early, or a tap returned twice).

"Failing" and "equals" use the tier's own rule: |a - b| <= atol + rtol * |b|. It costs a few passes
over one tensor, so the runner calls it once per case and tier, at that case's first failing tap.
"""

from __future__ import annotations

import numpy as np

ROUNDED_F32 = "got equals expected rounded to float32"
NOT_CORRECTLY_ROUNDED = "not correctly rounded: over 0.5 eps units where the golden is within 0.5"
SHIFTED = "the same value at a shifted position"
SIGN_FLIPPED = "sign flipped"
MISSING_MASK = "-inf expected, finite got"
PREVIOUS_TAP = "values of the previous tap"

EPS32 = float(np.finfo(np.float32).eps)
ROUNDING_SIZED = 4.0  # eps32 units: the most a failing cell may be off for NOT_CORRECTLY_ROUNDED


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """The tier's rule, cell by cell; an infinity is close only to the same infinity, NaN to nothing."""
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(a) & np.isfinite(b)
        near = np.abs(np.where(finite, a - b, 0.0)) <= atol + rtol * np.abs(np.where(finite, b, 0.0))
        return np.where(finite, near, (a == b) & ~np.isnan(a))


def _rounded_f32(a: np.ndarray, b: np.ndarray, bad: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        rounded = b.astype(np.float32).astype(np.float64)
    return bool(np.all(a[bad] == rounded[bad]))


def _not_correctly_rounded(a: np.ndarray, bad: np.ndarray, truth: np.ndarray, golden32: np.ndarray) -> bool:
    if truth.shape != a.shape or golden32.shape != a.shape:
        return False
    t = truth.astype(np.float64)
    cells = bad & np.isfinite(t) & (t != 0.0)
    if not cells.any():
        return False
    scale = EPS32 * np.abs(np.where(cells, t, 1.0))
    with np.errstate(invalid="ignore"):
        units = np.abs(a - t) / scale
        golden_units = np.abs(golden32.astype(np.float64) - t) / scale
    if not np.all(units[cells] <= ROUNDING_SIZED):  # NaN fails too: not a rounding-sized error
        return False
    return bool(np.any((units > 0.5) & (golden_units <= 0.5) & cells))


def _take(x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def _shifted(a: np.ndarray, b: np.ndarray, bad: np.ndarray, axis: int, atol: float, rtol: float) -> bool:
    """actual[t] == expected[t + s] (s = +1 or -1) at most of the failing cells, and at all those it can."""
    n = a.shape[axis]
    if n < 2:
        return False
    for s in (1, -1):
        lo, hi = (0, n - 1) if s == 1 else (1, n)  # the positions t of `actual` that have a t + s
        a_part, bad_part = _take(a, axis, lo, hi), _take(bad, axis, lo, hi)
        b_part = _take(b, axis, lo + s, hi + s)
        if not bad_part.any() or 2 * int(bad_part.sum()) < int(bad.sum()):
            continue
        if bool(np.all(_close(a_part, b_part, atol, rtol)[bad_part])):
            return True
    return False


def diagnose(
    actual: object, expected: np.ndarray, tier: str, *, atol: float = 0.0, rtol: float = 0.0,
    truth: np.ndarray | None = None, golden32: np.ndarray | None = None, previous: np.ndarray | None = None,
    position_axis: int | None = None,
) -> list[str]:
    """The names of the patterns (module docstring) that explain where `actual` breaks `expected`; [] if none.

    `tier` is the golden's precision ("fp32" or "fp64"); `atol`/`rtol` the tier's tolerance for the tap;
    `truth` the float64 golden and `golden32` the float32 golden (for NOT_CORRECTLY_ROUNDED); `previous`
    the golden of the tap before it (PREVIOUS_TAP); `position_axis` the tap's query-position axis (SHIFTED).
    """
    if not isinstance(actual, np.ndarray) or actual.dtype.kind not in "fiu":
        return []
    a = actual.astype(np.float64)
    causes: list[str] = []
    if a.shape == expected.shape:
        b = expected.astype(np.float64)
        if np.any(np.isneginf(b) & np.isfinite(a)):
            causes.append(MISSING_MASK)
        bad = ~_close(a, b, atol, rtol) & np.isfinite(b)
        if bad.any():
            if tier == "fp64" and _rounded_f32(a, b, bad):
                causes.append(ROUNDED_F32)
            elif truth is not None and golden32 is not None and _not_correctly_rounded(a, bad, truth, golden32):
                causes.append(NOT_CORRECTLY_ROUNDED)
            if position_axis is not None and 0 <= position_axis < a.ndim and _shifted(a, b, bad, position_axis,
                                                                                      atol, rtol):
                causes.append(SHIFTED)
            if bool(np.all(_close(a[bad], -b[bad], atol, rtol))):
                causes.append(SIGN_FLIPPED)
    if previous is not None and previous.shape == a.shape:
        p = previous.astype(np.float64)
        same_as_expected = p.shape == expected.shape and bool(np.all(_close(expected.astype(np.float64), p,
                                                                             atol, rtol)))
        if not same_as_expected and bool(np.all(_close(a, p, atol, rtol))):
            causes.append(PREVIOUS_TAP)
    return causes
