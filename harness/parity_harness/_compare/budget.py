"""The error budget: every backend's error against the float64 truth, tap by tap, in float32 epsilons.

The tiers of `parity run` compare implementations with each other (float32 with the PyTorch float32
golden). The budget asks a different question: how far is each result from the truth, the
float64 golden, and is that a sensible amount of float32 round-off for a tensor of that size?

For a backend result `a` of one tap and the float64 golden `g` of the same tap:

    max_abs     = max over cases and finite cells of |a - g|
    magnitude M = max over cases and finite cells of |g|
    eps32 units = max_abs / (eps32 * M),  eps32 = 2**-23 ~ 1.19e-7 (numpy.finfo(float32).eps)
    eps64 units = max_abs / (eps64 * M),  eps64 = 2**-52 ~ 2.22e-16

One unit is the spacing of float32 numbers just above M (one ulp at M is between eps*M/2 and
eps*M). Masked attention scores (-inf on both sides) are left out; a structural mismatch (shape,
NaN, an infinity in the wrong place) is reported as such. The fixture's PyTorch float32 golden
gets its own row, "golden.fp32": it is the fp32 tier's reference, and it is not the truth either.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from parity_harness._compare.judge import FAIL, NOT_SUPPORTED, OK, max_abs_error
from parity_harness._core.status import Status
from parity_harness._fixture.fixture import Fixture
from parity_harness._fixture.tolerances import tap_magnitude

EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
GOLDEN_FP32 = "golden.fp32"  # the row of the fixture's own PyTorch float32 reference


@dataclass
class BudgetRow:
    """One backend x precision x tap against the float64 golden, worst over cases."""

    backend: str  # a backend name, or "golden.fp32" for the fixture's PyTorch float32 reference
    precision: str  # what it computed in: "fp32" or "fp64"
    tap: str
    status: Status  # OK (measured), FAIL (structural: shape, NaN, infinity) or NOT_SUPPORTED
    max_abs: float | None = None  # max |a - g| over cases and finite cells
    magnitude: float | None = None  # M: max |g| over cases and finite cells
    eps32_units: float | None = None  # max_abs / (eps32 * M)
    eps64_units: float | None = None  # max_abs / (eps64 * M)
    case: str | None = None  # where max_abs happened
    index: list[int] | None = None
    message: str = ""


def _units(max_abs: float, magnitude: float, eps: float) -> float:
    if max_abs == 0.0:
        return 0.0
    if magnitude == 0.0 or math.isinf(max_abs):
        return math.inf
    return max_abs / (eps * magnitude)


def tap_budget(
    backend: str, precision: str, tap: str, actual: dict[str, np.ndarray | None], truth: dict[str, np.ndarray],
    magnitude: float | None = None,
) -> BudgetRow:
    """The budget row of one tap: `actual` and `truth` are {case: array} (actual None when missing).

    `magnitude`: M of `truth` when the caller knows it (`Fixture.golden_magnitudes`, measured once per
    golden, not once per backend); None measures it here (`tap_magnitude`).
    """
    if magnitude is None:
        magnitude = tap_magnitude(truth.values())
    row = BudgetRow(backend, precision, tap, OK, 0.0, magnitude)
    worst = -1.0
    for case, g in truth.items():
        a = actual.get(case)
        if a is None:
            row.status, row.max_abs, row.case, row.message = FAIL, math.inf, case, "missing"
            continue
        try:
            cmp = max_abs_error(np.asarray(a), g)  # judged in float64, without a copy: |a - g| and its cell only
        except (TypeError, ValueError) as exc:  # not numbers at all: the tier comparison reports it too
            row.status, row.max_abs, row.case, row.message = FAIL, math.inf, case, f"not numeric ({exc})"
            continue
        if cmp.message:
            row.status, row.max_abs, row.case, row.index, row.message = FAIL, math.inf, case, cmp.index, cmp.message
            continue
        if cmp.max_abs > worst and row.status == OK:
            worst, row.max_abs, row.case, row.index = cmp.max_abs, cmp.max_abs, case, cmp.index
    assert row.max_abs is not None and row.magnitude is not None
    row.eps32_units = _units(row.max_abs, row.magnitude, EPS32)
    row.eps64_units = _units(row.max_abs, row.magnitude, EPS64)
    return row


def merge_rows(a: BudgetRow | None, b: BudgetRow) -> BudgetRow:
    """Two cases' rows of one tap as one row, as if `tap_budget` had seen both cases."""
    if a is None:
        return b
    out = copy.copy(a)
    out.magnitude = max(a.magnitude or 0.0, b.magnitude or 0.0)
    if b.status == FAIL:
        out.status, out.max_abs, out.case, out.index, out.message = FAIL, math.inf, b.case, b.index, b.message
    elif a.status == OK and (b.max_abs or 0.0) > (a.max_abs or 0.0):
        out.max_abs, out.case, out.index = b.max_abs, b.case, b.index
    assert out.max_abs is not None
    out.eps32_units = _units(out.max_abs, out.magnitude, EPS32)
    out.eps64_units = _units(out.max_abs, out.magnitude, EPS64)
    return out


class BudgetAccumulator:
    """The budget rows of one backend run, built one case at a time (nothing of a case is kept)."""

    def __init__(self, backend: str, precision: str, tap_names: list[str], supported: list[str]) -> None:
        self.backend, self.precision, self.tap_names, self.supported = backend, precision, tap_names, set(supported)
        self.merged: dict[str, BudgetRow] = {}

    def add_case(self, case: str, output: Mapping[str, np.ndarray | None], truth: Mapping[str, np.ndarray],
                 magnitudes: Mapping[str, float] | None = None) -> None:
        """One case's rows; `magnitudes`: {tap: M} of `truth` when known (`Fixture.golden_magnitudes`)."""
        for tap in self.tap_names:
            if tap in self.supported:
                row = tap_budget(self.backend, self.precision, tap, {case: output.get(tap)}, {case: truth[tap]},
                                 None if magnitudes is None else magnitudes[tap])
                self.merged[tap] = merge_rows(self.merged.get(tap), row)

    def rows(self) -> list[BudgetRow]:
        """Every tap in dataflow order; a tap not supported gets its "not_supported" row."""
        return [self.merged[tap] if tap in self.merged else BudgetRow(self.backend, self.precision, tap, NOT_SUPPORTED)
                for tap in self.tap_names]


def reference_rows(fixture: Fixture) -> list[BudgetRow]:
    """The fixture's PyTorch float32 golden against its float64 golden (the "golden.fp32" row), case by case."""
    acc = BudgetAccumulator(GOLDEN_FP32, "fp32", fixture.tap_names, fixture.tap_names)
    for case in fixture.cases:
        acc.add_case(case.name, fixture.golden_case("fp32", case.name), fixture.golden_case("fp64", case.name),
                     fixture.golden_magnitudes("fp64", case.name))
    return acc.rows()


def _cell(row: BudgetRow | None, eps_field: str) -> str:
    if row is None or row.status == NOT_SUPPORTED:
        return "n/a"
    if row.status == FAIL or row.max_abs is None or math.isinf(row.max_abs):
        return "FAIL"
    if row.max_abs == 0.0:
        return "0"
    units = getattr(row, eps_field)
    return f"{row.max_abs:.1e} ({units:.2g})"


def format_budget(rows: list[BudgetRow], tap_order: list[str]) -> list[str]:
    """The budget as text: one table per precision, a row per tap, a column per backend.

    Each cell is `max_abs (units)`: float32 results in eps32 units, float64 results in eps64 units;
    "0" is an exact match, "n/a" a tap the backend does not produce.
    """
    lines = ["Error budget against the float64 truth (golden.fp64): max |a - truth| over cases "
             "(in eps units at the tap's magnitude M = max |truth|)."]
    width = max((len(t) for t in tap_order), default=10)
    for precision, eps_field, eps_name in (("fp32", "eps32_units", "eps32 = 2^-23"),
                                            ("fp64", "eps64_units", "eps64 = 2^-52")):
        columns = list(dict.fromkeys(r.backend for r in rows if r.precision == precision))
        if not columns:
            continue
        by_key = {(r.backend, r.tap): r for r in rows if r.precision == precision}
        widths = [max(len(c), 16) for c in columns]
        lines.append("")
        lines.append(f"{precision} results, units of {eps_name} x M:")
        lines.append(f"{'tap':<{width}}  {'M':>7}  " + "  ".join(f"{c:>{w}}" for c, w in zip(columns, widths,
                                                                                                strict=True)))
        for tap in tap_order:
            mags = [r.magnitude for c in columns if (r := by_key.get((c, tap))) is not None and r.magnitude]
            mag = f"{max(mags):.1e}" if mags else "-"
            cells = [_cell(by_key.get((c, tap)), eps_field) for c in columns]
            lines.append(f"{tap:<{width}}  {mag:>7}  " + "  ".join(f"{x:>{w}}" for x, w in zip(cells, widths,
                                                                                                 strict=True)))
        worst = []
        for c in columns:
            measured = [r for r in rows if r.backend == c and r.precision == precision and r.status != NOT_SUPPORTED]
            units = max((getattr(r, eps_field) for r in measured if getattr(r, eps_field) is not None), default=None)
            worst.append("-" if units is None else "inf" if math.isinf(units) else f"{units:.2g}")
        lines.append(f"{'worst (units)':<{width}}  {'':>7}  " + "  ".join(f"{x:>{w}}" for x, w in zip(worst, widths,
                                                                                                        strict=True)))
    return lines
