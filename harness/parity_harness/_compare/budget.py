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


# The aggregate rule (docs/tolerances.md, "Systematic error"): what the per-cell bound lets through when
# every cell is a little wrong the same way. Over every case's finite cells of a tap, e = a - t (a the
# backend's value, t the float64 golden), two statistics in units of the precision's eps:
#   gain   G = sum(t * e) / sum(t * t) / eps         (the least-squares gain error through the origin)
#   offset B = mean(e) / (rms(t) * eps)              (the mean error, relative to the tap's size)
# Both are ratios of streaming sums (one case in memory), and both stay small for round-off, which
# has no sign; a backend returning every value x (1 + g) has G = g / eps, one adding d has B = d / (rms * eps).
# A fixture whose measured budget needs a per-cell atol k times its tier's default at a tap (a per-tap
# override: ill-conditioned taps, magnitudes carried from upstream) has round-off k times larger there,
# its systematic part included, so each is judged per unit of `allowance` = max(1, atol_tap / atol_default),
# atol_default the one `parity export` writes (1 at the default tolerance, and in the reduced precisions,
# whose per-tap rule has no override).


@dataclass
class SystematicRow:
    """One backend x precision x tap's systematic error against the float64 truth, over every case."""

    backend: str
    precision: str
    tap: str
    cells: int  # finite cells measured (t and a finite)
    gain: float  # sum(t e) / sum(t t): the relative gain error (0 when there are no cells)
    offset: float  # mean(e) / rms(t): the mean error relative to the tap's rms (0 when there are no cells)
    eps: float  # the precision's eps: the unit of both
    allowance: float = 1.0  # max(1, the tap's per-cell atol / the exported default atol): the fixture's own budget

    @property
    def gain_eps(self) -> float:
        return abs(self.gain) / self.eps

    @property
    def offset_eps(self) -> float:
        return abs(self.offset) / self.eps

    @property
    def units(self) -> float:
        """What the bound is compared with: the larger of |G| and |B| in eps, per unit of `allowance`."""
        return max(self.gain_eps, self.offset_eps) / self.allowance


class SystematicAccumulator:
    """The streaming sums of the aggregate rule per tap: count, sum(t e), sum(t t), sum(e); nothing of a case kept."""

    def __init__(self, backend: str, precision: str, eps: float, tap_names: list[str], supported: list[str],
                 allowance: Mapping[str, float] | None = None) -> None:
        """`allowance`: {tap: max(1, atol_tap / atol_default)} (absent: 1)."""
        self.backend, self.precision, self.eps = backend, precision, eps
        self.taps = [t for t in tap_names if t in set(supported)]
        self.sums: dict[str, list[float]] = {t: [0.0, 0.0, 0.0, 0.0] for t in self.taps}
        self.allowance = {t: max(1.0, (allowance or {}).get(t, 1.0)) for t in self.taps}

    def add_case(self, output: Mapping[str, np.ndarray | None], truth: Mapping[str, np.ndarray]) -> None:
        """One case: `output` {tap: array} (rows already selected as the golden keeps them), `truth` the fp64 golden."""
        for tap in self.taps:
            a, t = output.get(tap), truth.get(tap)
            if a is None or t is None:
                continue
            try:
                a = np.asarray(a, dtype=np.float64)
            except (TypeError, ValueError):  # not numbers: the per-cell check fails it
                continue
            if a.shape != t.shape:
                continue  # the per-cell check fails a shape mismatch
            t = np.asarray(t, dtype=np.float64)
            with np.errstate(invalid="ignore", over="ignore"):  # -inf - -inf (masked scores): left out below
                e = a - t
            finite = np.isfinite(e)
            if not finite.all():
                e, t = e[finite], t[finite]
            else:
                e, t = e.ravel(), t.ravel()
            s = self.sums[tap]
            s[0] += e.size
            s[1] += float(np.dot(t, e))
            s[2] += float(np.dot(t, t))
            s[3] += float(e.sum())

    def rows(self) -> list[SystematicRow]:
        out = []
        for tap in self.taps:
            n, te, tt, se = self.sums[tap]
            gain = te / tt if tt > 0 else 0.0
            offset = (se / n) / math.sqrt(tt / n) if n and tt > 0 else 0.0
            out.append(SystematicRow(self.backend, self.precision, tap, int(n), gain, offset, self.eps,
                                     self.allowance[tap]))
        return out
