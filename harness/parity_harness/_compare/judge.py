"""The one judge: compare two tensors, and fold the results into per-tap verdicts and first divergences.

Every check parity makes is a `CheckResult`, made by `judge_tensor`: a forward tap of a case (live
or read from a dump) and a decoding step of a prompt (`step` set, the prompt in `case`) alike. Every
set of results is folded by `fold` into `TapSummary` rows and `FirstDivergence`s, in one order: the
step (0 for a forward tap), then the tap's place in dataflow order.

The rules (docs/spec.md, section 3):
- shape and dtype must match exactly; a mismatch fails, with both in the message;
- NaN on the candidate side fails (NaN in a golden tensor is a broken fixture and fails too);
- an infinity matches only the same infinity at the same place (masked attention scores);
- a finite cell passes when |a - b| <= atol + rtol * |b|;
- reported: max absolute error, max relative error (|a - b| / max(|b|, guard), where the guard is
  the atol, or the dtype's tiny when atol is 0), the index and both values of the worst cell,
  and the smallest atol that would have passed with the same rtol ("min_atol").
- a reduced-precision result (fp16, bf16: float32 arrays, `_core/precision.py`) is compared in float64
  with either golden; where it holds an infinity or NaN and the golden is finite, a value left the
  precision's range (fp16 ends at 65504): the check fails with "overflow" and the first such cell,
  before any difference is looked at (`overflow_message`), so the first divergence names the first
  tap where a value overflowed instead of a wall of NaN differences.
- a result on a coarser grid than its declared precision was computed in that coarser dtype: when at
  least `MIN_GRID_CANDIDATES` cells of the golden, rounded to the declared precision, lie off the
  coarser grid and the result holds every one of them on it, the check fails with "precision: ...
  computed in bf16" (`coarser_grid_message`): fp32 declared, bf16's grid (the float32's low 16 bits
  zero) or fp16's (x == f32(f16(x)), |x| <= 65504); fp16 declared, bf16's grid. After overflow and
  NaN, before the tolerance: it names the cause where the tolerance alone may not see it.
Results are plain dataclasses that serialize to JSON with `dataclasses.asdict`. The comparison makes
no tensor-sized temporaries (`_measure`: slices in reused work rows, cell for cell the rule above);
tests/compare/test_compare.py holds the whole-array version it replaced as its oracle. The error budget's
question alone (max |a - b| against the float64 truth, and where) is `max_abs_error`, on the same slices.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from parity_harness._core.precision import DTYPES, MAX_FINITE, Precision, is_reduced, is_stored, off_grid
from parity_harness._core.status import Status

OK, FAIL, NOT_SUPPORTED = Status.OK, Status.FAIL, Status.NOT_SUPPORTED

# The coarser grids a declared precision's results must not all sit on, coarsest first, with their
# significant bits (docs/tolerances.md, "Values on a coarser grid"); fp64 and bf16 have none checked.
COARSER_GRIDS: dict[str, tuple[tuple[Precision, int], ...]] = {"fp32": (("bf16", 8), ("fp16", 11)),
                                                          "fp16": (("bf16", 8),)}
# At least this many candidate cells (the golden off the coarser grid): an honest fp16 result lands on
# bf16's grid with odds 1/8 a cell, so (1/8)^16 = 2^-48 for a false alarm; fp32 on bf16's, (2^-16)^16.
MIN_GRID_CANDIDATES = 16

# The case of the one check a tap that fails the aggregate rule adds (a gain or an offset over every case,
# `_run/runner.py`'s CaseJudge; docs/tolerances.md, "Systematic error"): no case of a fixture has this name
# (a case's name holds no '/').
SYSTEMATIC_CASE = "(all/cases)"


@dataclass
class TensorComparison:
    passed: bool
    max_abs: float = 0.0  # over finite cells
    max_rel: float = 0.0  # over finite cells, guarded near zero
    min_atol: float = 0.0  # smallest atol that passes with the same rtol; inf for a structural failure
    index: list[int] | None = None  # the worst cell (the worst breach, else the largest error)
    actual: float | None = None  # candidate value there
    expected: float | None = None  # golden value there
    n_bad: int = 0  # failing cells
    message: str = ""  # why it failed, for structural failures (shape, dtype, NaN, infinity)


def _cell(x: np.ndarray, index: tuple[int, ...]) -> float:
    return float(x[index]) if x.ndim else float(x)


def compare_tensors(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> TensorComparison:
    """Compare a candidate tensor with a golden one under the rules above."""
    return _compare(actual, expected, atol, rtol)


# Cells per slice of `_measure`: three float64 work rows of 512 KiB, allocated once per thread and reused
# by every check, so a large tap costs no fresh (page-faulting) temporaries and each pass stays in cache.
_CHUNK = 1 << 16
_F64 = np.dtype(np.float64)


class _Scratch(threading.local):
    """The work rows of `_measure`, one set per thread."""

    def __init__(self) -> None:
        self.rows = np.empty((3, _CHUNK))


_SCRATCH = _Scratch()


def _compare(actual: object, expected: np.ndarray, atol: float, rtol: float,
             actual_as: np.dtype | None = None, expected_as: np.dtype | None = None) -> TensorComparison:
    """`compare_tensors(actual.astype(actual_as), expected.astype(expected_as), atol, rtol)` without the copies.

    `*_as` is float64 or None (the side's own dtype): the judge compares a float32 side in float64 (a
    float64 result against the float32 golden, fp16 and bf16 containers). Every side is judged in
    float64: a float32 array is cast cell by cell inside the ufuncs (`dtype=float64`), exactly as a
    float64 copy would hold it; any other dtype is copied to float64 as before.
    """
    if not isinstance(actual, np.ndarray):
        return TensorComparison(False, math.inf, math.inf, math.inf, message=f"not an array ({type(actual).__name__})")
    if actual.shape != expected.shape:
        return TensorComparison(
            False, math.inf, math.inf, math.inf,
            message=f"shape {list(actual.shape)} != expected {list(expected.shape)}",
        )
    a_dtype = actual.dtype if actual_as is None else actual_as
    b_dtype = expected.dtype if expected_as is None else expected_as
    if a_dtype != b_dtype:
        return TensorComparison(False, math.inf, math.inf, math.inf, message=f"dtype {a_dtype} != expected {b_dtype}")
    if actual.size == 0:
        return TensorComparison(True)
    a, b = _flat64(actual), _flat64(expected)
    guard = atol if atol > 0 else float(np.finfo(b_dtype).tiny) if b_dtype.kind == "f" else None
    # One pass learns whether everything is finite: |a - b| is finite in every cell iff both sides are
    # (an overflowing a - b of two finite float64s, too, takes the careful path).
    found = _measure(a, b, atol, rtol, guard, masked=False) if guard is not None else None
    if found is None:
        failure = _structural(a, b, actual.shape)
        if failure is not None:
            return failure
        if guard is None:  # not a float dtype: what the original raised (ValueError) or computed
            guard = float(np.finfo(b_dtype).tiny)
        found = _measure(a, b, atol, rtol, guard, masked=True)
        assert found is not None
    max_abs, max_rel, min_atol, worst, n_bad = found
    idx = [int(i) for i in np.unravel_index(worst, actual.shape)]
    return TensorComparison(not n_bad, max_abs, max_rel, min_atol, idx, float(a[worst]), float(b[worst]), n_bad)


def _flat64(x: np.ndarray) -> np.ndarray:
    """`x` flattened (C order, a view when it can be), as float32 or float64: what judging in float64 reads."""
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    return x.reshape(-1)


def _structural(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> TensorComparison | None:
    """The NaN and infinity rules on flat `a`, `b` (first the candidate's NaNs, then the golden's, then
    infinities): the failure, or None when every infinity is matched by the same one."""
    for side, x in (("candidate", a), ("golden", b)):
        nan = np.isnan(x)
        if nan.any():
            return _failure(nan, a, b, shape, f"NaN in the {side} at {{}}")
    # No NaN is left: a cell is an infinity mismatch iff either side is infinite and they differ (the
    # same infinity compares equal; the other infinity, or any finite value, does not).
    mismatch = np.isinf(a)
    mismatch |= np.isinf(b)
    mismatch &= a != b
    if mismatch.any():
        return _failure(mismatch, a, b, shape, "infinity mismatch at {}: {} vs {}")
    return None


def _failure(mask: np.ndarray, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...], what: str) -> TensorComparison:
    """A structural failure at the first cell of `mask` (C order); `what` formats index, candidate, golden."""
    first = int(np.argmax(mask))
    idx = [int(i) for i in np.unravel_index(first, shape)]
    x, y = float(a[first]), float(b[first])
    return TensorComparison(False, math.inf, math.inf, math.inf, idx, x, y, int(np.count_nonzero(mask)),
                            what.format(idx, x, y))


def _measure(a: np.ndarray, b: np.ndarray, atol: float, rtol: float, guard: float,
             masked: bool) -> tuple[float, float, float, int, int] | None:
    """(max_abs, max_rel, min_atol, worst flat cell, n_bad) of flat `a` against `b`, a slice at a time.

    Cell for cell the whole-array rule, in its floating-point order: diff = |a - b|, abs_b = |b| (both 0
    where b is infinite, when `masked`: the infinities are matched), rel = diff / max(abs_b, guard),
    min_atol = max(diff - rtol * abs_b, 0), excess = diff - (atol + rtol * abs_b), a breach where
    excess > 0; the worst cell is the first largest excess when a cell breaches, else the first
    largest diff. Maxima over slices are maxima over the whole (NaN propagates; the first slice holding
    the largest holds its first cell). Not `masked`: None as soon as a difference is not finite.
    """
    rows = _SCRATCH.rows
    abs_max: list[float] = []
    abs_at: list[int] = []
    rel_max: list[float] = []
    atol_max: list[float] = []
    excess_max: list[float] = []
    excess_at: list[int] = []
    n_bad = 0
    with np.errstate(over="ignore", invalid="ignore"):  # inf - inf, and a huge error over a tiny guard (inf)
        for start in range(0, a.size, _CHUNK):
            x, y = a[start:start + _CHUNK], b[start:start + _CHUNK]
            diff, t, u = rows[0, :x.size], rows[1, :x.size], rows[2, :x.size]
            inf_b = _abs_diff(x, y, diff, masked)
            i = int(np.argmax(diff))
            if not masked and not math.isfinite(diff[i]):
                return None
            abs_max.append(float(diff[i]))
            abs_at.append(start + i)
            np.abs(y, out=t, dtype=np.float64)  # abs_b
            if inf_b is not None:
                np.copyto(t, 0.0, where=inf_b)
            np.maximum(t, guard, out=u)
            np.divide(diff, u, out=u)  # rel
            rel_max.append(float(u.max()))
            if rtol == 0.0:  # abs_b is finite here: rtol * abs_b is 0, diff - 0 is diff, allowed is atol
                atol_max.append(abs_max[-1])  # the largest max(diff, 0): diff >= 0, and no NaN is left
                # The largest excess diff - atol is (largest diff) - atol: rounding is monotonic. Not above 0,
                # no cell breaches, and this slice's cell is never the worst one (a breach elsewhere is larger).
                if not abs_max[-1] - atol > 0.0:
                    excess_max.append(abs_max[-1] - atol)
                    excess_at.append(start + i)
                    continue
                np.subtract(diff, atol, out=t)  # excess, as diff - (atol + 0)
            else:
                np.multiply(t, rtol, out=t)  # rtol * abs_b
                np.subtract(diff, t, out=u)
                m = float(u.max())  # the largest max(u, 0): u's max, 0 when it is negative (NaN stays NaN)
                atol_max.append(0.0 if m < 0.0 else m)
                np.add(t, atol, out=t)  # allowed = atol + rtol * abs_b
                np.subtract(diff, t, out=t)  # excess
            j = int(np.argmax(t))
            excess_max.append(float(t[j]))
            excess_at.append(start + j)
            if not t[j] <= 0.0:  # a breach (or a NaN) in this slice: count them
                n_bad += int(np.count_nonzero(t > 0.0))
    worst = excess_at[_first_max(excess_max)] if n_bad else abs_at[_first_max(abs_max)]
    return _max(abs_max), _max(rel_max), _max(atol_max), worst, n_bad


def _abs_diff(x: np.ndarray, y: np.ndarray, diff: np.ndarray, masked: bool) -> np.ndarray | None:
    """diff = |x - y| in float64, a slice; `masked`: 0 where y is infinite, and that mask is returned (else None)."""
    np.subtract(x, y, out=diff, dtype=np.float64)
    np.abs(diff, out=diff)
    if not masked:
        return None
    inf_b: np.ndarray = np.isinf(y)
    np.copyto(diff, 0.0, where=inf_b)
    return inf_b


@dataclass
class AbsError:
    """What the error budget reads of a comparison: the largest |a - b|, its first cell, or a structural failure."""

    max_abs: float
    index: list[int] | None = None
    message: str = ""  # shape, dtype, NaN or infinity (max_abs is then inf), as `_compare` words it


def max_abs_error(actual: np.ndarray, expected: np.ndarray) -> AbsError:
    """`_compare(actual, expected, 0.0, 0.0, actual_as=float64)`'s max_abs, index and message, measuring nothing else.

    At atol = rtol = 0 the excess is the difference itself, so `_compare`'s worst cell is the first
    largest |a - b|: one subtraction, one abs and one argmax a slice (`_measure_abs`) give what the
    budget read of `_measure`. The structural rules are `_compare`'s own (`_structural`).
    """
    if actual.shape != expected.shape:
        return AbsError(math.inf, message=f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    if expected.dtype != _F64:
        return AbsError(math.inf, message=f"dtype {_F64} != expected {expected.dtype}")
    if actual.size == 0:
        return AbsError(0.0)
    a, b = _flat64(actual), _flat64(expected)
    found = _measure_abs(a, b, masked=False)
    if found is None:
        failure = _structural(a, b, actual.shape)
        if failure is not None:
            return AbsError(math.inf, failure.index, failure.message)
        found = _measure_abs(a, b, masked=True)
        assert found is not None
    max_abs, worst = found
    return AbsError(max_abs, [int(i) for i in np.unravel_index(worst, actual.shape)])


def _measure_abs(a: np.ndarray, b: np.ndarray, masked: bool) -> tuple[float, int] | None:
    """`_measure`'s max_abs and first largest diff cell alone, a slice at a time (None as it returns None)."""
    diff_row = _SCRATCH.rows[0]
    abs_max: list[float] = []
    abs_at: list[int] = []
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, a.size, _CHUNK):
            x, y = a[start:start + _CHUNK], b[start:start + _CHUNK]
            diff = diff_row[:x.size]
            _abs_diff(x, y, diff, masked)
            i = int(np.argmax(diff))
            if not masked and not math.isfinite(diff[i]):
                return None
            abs_max.append(float(diff[i]))
            abs_at.append(start + i)
    return _max(abs_max), abs_at[_first_max(abs_max)]


def _max(values: list[float]) -> float:
    """The largest of `values`, NaN if any is (as `ndarray.max` of the whole)."""
    return values[0] if len(values) == 1 else float(np.max(values))


def _first_max(values: list[float]) -> int:
    """Where the first largest of `values` is, the first NaN if any (as `np.argmax` of the whole)."""
    return 0 if len(values) == 1 else int(np.argmax(values))


@dataclass
class CheckResult:
    """One backend x precision x golden tier x case x tap (x decoding step)."""

    backend: str
    precision: str  # what the backend computed in: "fp32" or "fp64"
    golden: str  # which golden file it was compared with: "fp32" or "fp64"
    case: str
    tap: str
    status: Status
    passed: bool | None  # None when not supported
    atol: float
    rtol: float
    max_abs: float | None = None
    max_rel: float | None = None
    min_atol: float | None = None
    index: list[int] | None = None
    actual: float | None = None
    expected: float | None = None
    message: str = ""
    n_bad: int = 0  # cells that break tolerance
    step: int | None = None  # the decoding step (0: the prefill), `case` then names the prompt; None: forward
    n_cells: int = 0  # cells of the golden tensor (n_bad of n_cells break tolerance); 0 when not known


def judge_tensor(
    backend: str, precision: str, golden: str, case: str, tap: str, actual: np.ndarray | None,
    expected: np.ndarray, atol: float, rtol: float, step: int | None = None,
) -> CheckResult:
    """The one check: `actual` (None: declared but not returned, a failure) against `expected` at (atol, rtol).

    A float64 result judged against the float32 golden is compared in float64 (the golden upcast).
    """
    if actual is None:
        return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, step=step,
                           message="missing: the backend declares this tap but did not return it")
    if is_reduced(precision):
        container = np.dtype(DTYPES[cast(Precision, precision)])
        if isinstance(actual, np.ndarray) and actual.dtype == container and actual.shape == expected.shape:
            overflow = overflow_message(actual, expected, cast(Precision, precision))
            if overflow is not None:
                message, idx, n = overflow
                return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, math.inf, math.inf,
                                   math.inf, list(idx), _cell(actual, idx), _cell(expected, idx), message, n, step,
                                   int(expected.size))
        elif isinstance(actual, np.ndarray) and actual.dtype != container:
            return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, math.inf, math.inf,
                               math.inf, message=f"dtype {actual.dtype} != expected {container} ({precision} results "
                               f"are {container} arrays holding {precision} values)", step=step)
    # Judged in float64 without the copies: a reduced result's float32 container and either golden, a stored
    # weight format's float32 result and its weights' float64 golden, and the golden of another tier (the float32
    # golden of a float64 result).
    reduced = is_reduced(precision) or is_stored(precision)
    as_f64 = reduced and isinstance(actual, np.ndarray) and actual.dtype == np.float32
    cmp = _compare(actual, expected, atol, rtol, _F64 if as_f64 else None,
                   _F64 if reduced or golden != precision else None)
    # The grid check needs a float32 result without NaN: a NaN is a message of `cmp`, which then wins anyway.
    grid = None
    if (not cmp.message and precision in COARSER_GRIDS and isinstance(actual, np.ndarray)
            and actual.dtype == np.float32 and actual.shape == expected.shape):
        grid = coarser_grid_message(actual, expected, precision)
    if grid is not None:  # the numbers are reported; the verdict and the cause are the grid's
        message, n = grid
        return CheckResult(backend, precision, golden, case, tap, FAIL, False, atol, rtol, cmp.max_abs, cmp.max_rel,
                           cmp.min_atol, cmp.index, cmp.actual, cmp.expected, message, n, step, int(expected.size))
    return CheckResult(
        backend, precision, golden, case, tap, OK if cmp.passed else FAIL, cmp.passed, atol, rtol,
        cmp.max_abs, cmp.max_rel, cmp.min_atol, cmp.index, cmp.actual, cmp.expected, cmp.message, cmp.n_bad, step,
        int(np.size(expected)),
    )


def coarser_grid_message(actual: np.ndarray, expected: np.ndarray, precision: str) -> tuple[str, int] | None:
    """A float32 result of `precision` (fp32, or fp16's container) all on a coarser grid: (message, cells) or None.

    The candidates are the cells where the golden, rounded to `precision`, is finite and off the
    coarser grid (an exact computation in `precision` would leave them off it); zeros, ones, masked
    infinities and embeddings read from a bf16 checkpoint are on it in the golden too, and are not
    candidates. With at least `MIN_GRID_CANDIDATES` of them, every one on the grid in the result
    means the result was computed on that grid. One candidate off the grid in the result clears it
    of that grid: the first `GRID_PREFIX` cells (C order) are looked at first, and an honest result
    is cleared of every grid there, without a pass over the whole.
    """
    grids = COARSER_GRIDS.get(precision, ())
    if actual.size > GRID_PREFIX:
        head, declared = actual.flat[:GRID_PREFIX], _declared(expected.flat[:GRID_PREFIX], precision)
        grids = tuple(g for g in grids if not (off_grid(declared, g[0]) & off_grid(head, g[0])).any())
        if not grids:
            return None
    declared = _declared(expected, precision)
    for grid, bits in grids:
        candidates = off_grid(declared, grid)  # and the result finite, below
        if (candidates & off_grid(actual, grid)).any():  # a candidate off the grid in the result: cleared
            continue
        candidates &= np.isfinite(actual)
        n = int(np.count_nonzero(candidates))
        if n >= MIN_GRID_CANDIDATES:
            return (f"precision: all {n} values carry at most {bits} significant bits ({grid}'s grid) where "
                    f"{precision} was declared: computed in {grid}", n)
    return None


# Cells of a result `coarser_grid_message` looks at before the whole: an honest fp32 or fp16 result has a
# candidate off the coarser grid among the first few (7 in 8 cells of an fp16 one; nearly all of an fp32 one).
GRID_PREFIX = 4096


def _declared(expected: np.ndarray, precision: str) -> np.ndarray:
    """The golden rounded to the declared precision, as float32 (no copy of a float32 golden declared fp32)."""
    if precision == "fp16":
        return expected.astype(np.float16).astype(np.float32)
    return expected.astype(np.float32, copy=False)


def overflow_message(actual: np.ndarray, expected: np.ndarray,
                     precision: Precision) -> tuple[str, tuple[int, ...], int] | None:
    """A reduced-precision result that left its range: (message, first cell, cells) or None.

    A cell overflowed where the result is an infinity or NaN and the golden is finite: an inf is the
    value itself beyond the range; a NaN, an intermediate that was (inf - inf, inf x 0), as in a
    variance E[x^2] - E[x]^2 whose squares pass 65504 in fp16.
    """
    finite = np.isfinite(actual)
    if finite.all():
        return None
    gone = ~finite & np.isfinite(expected)
    if not gone.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(gone)[0])
    a, b = _cell(actual, idx), _cell(expected, idx)
    what = "the value itself" if math.isinf(a) else "an intermediate of this tap (inf - inf or inf x 0 gave NaN)"
    return (f"overflow: {a} at {list(idx)} where the golden is {b:.6g}: {what} left the {precision} range "
            f"(largest finite {MAX_FINITE[precision]:.6g}); {int(gone.sum())} such cells", idx, int(gone.sum()))


@dataclass
class TapSummary:
    """One tap of one backend x precision x golden tier, worst over cases."""

    backend: str
    precision: str
    golden: str
    tap: str
    status: Status
    passed: bool | None
    atol: float
    rtol: float
    n_cases: int = 0
    n_failed: int = 0
    max_abs: float | None = None
    max_rel: float | None = None
    min_atol: float | None = None
    worst_case: str | None = None
    message: str = ""
    worst_step: int | None = None  # a decoding tap: the step of its worst check


def summarize_tap(results: list[CheckResult]) -> TapSummary:
    """Fold the per-case results of one tap (same backend, precision, golden) into its worst case."""
    first = results[0]
    summary = TapSummary(first.backend, first.precision, first.golden, first.tap, first.status, first.passed,
                         first.atol, first.rtol)
    if first.status == NOT_SUPPORTED:
        return summary
    summary.n_cases = len(results)
    failed = [r for r in results if not r.passed]
    summary.n_failed = len(failed)
    summary.passed = not failed
    summary.status = OK if not failed else FAIL
    worst = max(results, key=lambda r: (not r.passed, r.max_abs if r.max_abs is not None else math.inf))
    summary.max_abs = max((r.max_abs for r in results if r.max_abs is not None), default=None)
    summary.max_rel = max((r.max_rel for r in results if r.max_rel is not None), default=None)
    summary.min_atol = max((r.min_atol for r in results if r.min_atol is not None), default=None)
    summary.worst_case, summary.worst_step = worst.case, worst.step
    summary.message = worst.message
    if any(r.max_abs is None for r in failed):  # a missing tap has no error to report: say "-", not 0
        summary.max_abs = summary.max_rel = summary.min_atol = None
    return summary


@dataclass
class FirstDivergence:
    """The first tap, in dataflow order, where a backend's tier breaks tolerance, and what precedes it."""

    backend: str
    precision: str
    golden: str
    tap: str
    case: str  # the case where that tap's error is worst
    index: list[int] | None
    actual: float | None
    expected: float | None
    max_abs: float | None
    atol: float
    message: str
    upstream_taps: int  # how many taps come before it in dataflow order
    upstream_max_abs: float  # worst error over every upstream tap and case (0.0 when it is the first tap)
    by_case: dict[str, str] = field(default_factory=dict)  # case -> its own first diverging tap
    n_bad: int = 0  # cells of that tap and case that break tolerance
    location: str = ""  # the worst cell named by axis: "position 3 ('sleeps'), dim 5" (see `name_index`)
    axes: dict[str, int] = field(default_factory=dict)  # the same by axis name: {"position": 3, "dim": 5}
    previous_tap: str | None = None  # the tap just before it in dataflow order that was compared
    previous_max_abs: float | None = None  # that tap's worst error over cases
    rtol: float = 0.0  # the tier's rtol for that tap (a cell passes when |diff| <= atol + rtol * |expected|)
    step: int | None = None  # decoding: the earliest failing step (then `upstream_*` cover every check before it)
    margin: float | None = None  # decoding: the golden's top-2 logit margin at that step
    cause: str = ""  # the likely cause, named from the numbers ("; "-joined, _compare/diagnose.py); "" when none
    op: str = ""  # where inside the tap it starts: a graph's node, its inputs and constants (`Backend.locate_op`)


def first_divergence(results: list[CheckResult], tap_order: list[str]) -> FirstDivergence | None:
    """The first diverging (step,) tap of one backend x precision x golden tier, or None if all agree.

    Checks are ordered by step (0 for a forward tap), then by the tap's place in `tap_order`; at the first
    failing place, the case (or prompt) with the largest error is reported.
    """
    order = {t: i for i, t in enumerate(tap_order)}

    def place(r: CheckResult) -> tuple[int, int]:
        return (r.step or 0, order[r.tap])

    failing = [r for r in results if r.status == FAIL]
    if not failing:
        return None
    by_case: dict[str, str] = {}
    for r in sorted(failing, key=place):
        by_case.setdefault(r.case, r.tap if r.step is None else f"step{r.step}/{r.tap}")
    first = min(place(r) for r in failing)
    worst = max((r for r in failing if place(r) == first),
                key=lambda r: r.max_abs if r.max_abs is not None else math.inf)
    upstream = [r for r in results if r.status != NOT_SUPPORTED and place(r) < first]
    upstream_max = max((r.max_abs for r in upstream if r.max_abs is not None), default=0.0)
    previous = max((place(r) for r in upstream), default=None)
    previous_tap = tap_order[previous[1]] if previous is not None else None
    previous_max = max((r.max_abs for r in upstream if place(r) == previous and r.max_abs is not None), default=None)
    return FirstDivergence(
        worst.backend, worst.precision, worst.golden, worst.tap, worst.case, worst.index, worst.actual,
        worst.expected, worst.max_abs, worst.atol, worst.message, len({place(r) for r in upstream}), upstream_max,
        dict(sorted(by_case.items())), worst.n_bad, previous_tap=previous_tap, previous_max_abs=previous_max,
        rtol=worst.rtol, step=worst.step,
    )


def fold(results: list[CheckResult], tap_order: list[str]) -> tuple[list[TapSummary], list[FirstDivergence]]:
    """Per-tap summaries (worst over cases and steps) and first divergences, per backend x precision x golden."""
    groups: dict[tuple[str, str, str], list[CheckResult]] = {}
    for r in results:
        groups.setdefault((r.backend, r.precision, r.golden), []).append(r)
    summaries: list[TapSummary] = []
    divergences: list[FirstDivergence] = []
    for group in groups.values():
        for tap in tap_order:
            at_tap = [r for r in group if r.tap == tap]
            if at_tap:
                summaries.append(summarize_tap(at_tap))
        div = first_divergence(group, tap_order)
        if div is not None:
            divergences.append(div)
    return summaries, divergences


def name_index(
    names: list[str], index: list[int], tokens: tuple[int, ...], vocab: list[str],
) -> tuple[str, dict[str, int]]:
    """A cell's index named by axis, with the words at its positions and its vocabulary token.

    `names` are the tap's axis names, from its family's table (`Fixture.model.axis_names`): position,
    key_position, head, dim, neuron, token, scale.

    `("position 3 ('sleeps'), head 1, key position 0 ('.')", {"position": 3, "head": 1, "key_position": 0})`
    """
    parts: list[str] = []
    axes: dict[str, int] = {}
    for name, i in zip(names, index, strict=False):
        axes[name] = int(i)
        label = name.replace("_", " ")
        if name in ("position", "key_position") and 0 <= i < len(tokens):
            parts.append(f"{label} {i} ({vocab[tokens[i]]!r})")
        elif name == "token" and 0 <= i < len(vocab):
            parts.append(f"{label} {i} ({vocab[i]!r})")
        elif name == "scale":
            continue
        else:
            parts.append(f"{label} {i}")
    return ", ".join(parts), axes
