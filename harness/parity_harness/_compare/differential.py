"""The differential view: two backends side by side per tap, against the float64 truth and each other.

The tiers compare a backend with the PyTorch golden of its precision, so a float32 shortcut in a
float32-only backend (sin/cos positions computed in float32) hides inside the fp32 tolerance. This view
asks where a backend is measurably worse than float32 can be. Each tap's error of each backend against
the float64 truth (golden.fp64) is in eps32 units, max |a - truth| / (eps32 x M) as in the error budget
(_compare/budget.py), next to the float32 golden's own (the "golden.fp32" row) and to the two backends'
difference, max |A - B| / (eps32 x M).

The rule (docs/diagnosis.md): at a tap where the float32 golden is the float64 truth rounded once to
float32 (every cell of every case: the best float32 can do, as for the embeddings and positions), a
backend is flagged when its error exceeds the golden's while its peer's is at or below it. Elsewhere
every float32 result carries its own accumulated round-off, the golden's as well, and nothing is flagged.

Only a tap both backends produce (for every case) is compared. `Differential.coverage` says how many of the
fixture's taps that is and which were not compared and why, as `parity run`'s verdict says "taps compared":
a partial comparison is never presented as a complete one, and none at all is NOTHING_COMPARED (exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from parity_harness._compare.budget import EPS32, GOLDEN_FP32, BudgetRow, tap_budget
from parity_harness._compare.judge import NOT_SUPPORTED, OK
from parity_harness._core.precision import BackendOutput
from parity_harness._core.status import Verdict
from parity_harness._fixture.fixture import Fixture


@dataclass
class DiffRow:
    """One tap: each backend's and the float32 golden's error against the truth, in eps32 units at M."""

    tap: str
    magnitude: float | None  # M = max |truth| over cases
    golden: float | None  # golden.fp32's units
    rounded_once: bool  # golden.fp32 is the truth rounded once to float32 here: the rule applies
    units: dict[str, float | None]  # backend -> its units (None: not produced; inf: structurally wrong)
    between: float | None  # max |A - B| / (eps32 x M); None when one of them does not produce the tap
    flagged: list[str] = field(default_factory=list)  # the backends flagged at this tap


@dataclass
class Differential:
    backends: tuple[str, str]
    precision: str
    rows: list[DiffRow]

    @property
    def flags(self) -> list[tuple[str, DiffRow]]:
        return [(b, row) for row in self.rows for b in row.flagged]

    @property
    def compared(self) -> list[str]:
        """The taps measured for both backends (every case): the only ones the view compares."""
        return [row.tap for row in self.rows if row.between is not None]

    @property
    def not_compared(self) -> dict[str, list[str]]:
        """Why each other tap was not compared -> those taps, in the fixture's order."""
        why: dict[str, list[str]] = {}
        for row in self.rows:
            if row.between is None:
                missing = [name for name in self.backends if row.units.get(name) is None]
                reason = (f"{' and '.join(missing)} {'does' if len(missing) == 1 else 'do'} not produce them"
                          if missing else "not produced by both for every case")
                why.setdefault(reason, []).append(row.tap)
        return why

    @property
    def coverage(self) -> str:
        """'taps compared: 1/43 (logits); not compared: 42 taps, hook_embed .. ln_final.hook_normalized (B does
        not produce them)': how much of the fixture the view compared, said on every verdict."""
        compared, total = self.compared, len(self.rows)
        text = f"taps compared: {len(compared)}/{total}"
        if compared and len(compared) < total:
            text += f" ({_taps_text(compared)})"
        missing = [f"{_taps_text(taps)} ({reason})" for reason, taps in self.not_compared.items()]
        return text + (f"; not compared: {'; '.join(missing)}" if missing else "")

    @property
    def verdict(self) -> Verdict:
        """DISAGREE when a backend is flagged; NOTHING_COMPARED when no tap was measured for both."""
        if not self.compared:
            return Verdict.NOTHING_COMPARED
        return Verdict.of(not self.flags)


def _taps_text(taps: list[str]) -> str:
    """'logits', 'hook_embed, logits' or '42 taps, hook_embed .. ln_final.hook_normalized'."""
    return ", ".join(taps) if len(taps) <= 3 else f"{len(taps)} taps, {taps[0]} .. {taps[-1]}"


def rounded_once_taps(fixture: Fixture) -> set[str]:
    """The taps whose float32 golden equals the float64 golden rounded to float32 at every cell of every case."""
    taps = set(fixture.tap_names)
    for case in fixture.cases:
        g32, g64 = fixture.golden_case("fp32", case.name), fixture.golden_case("fp64", case.name)
        for tap in list(taps):
            with np.errstate(over="ignore"):
                if not np.array_equal(g64[tap].astype(np.float32), g32[tap]):
                    taps.discard(tap)
    return taps


def _units(row: BudgetRow | None) -> float | None:
    if row is None or row.status == NOT_SUPPORTED:
        return None
    if row.status != OK or row.eps32_units is None:
        return math.inf
    return row.eps32_units


def _between(fixture: Fixture, tap: str, a: BackendOutput, b: BackendOutput, magnitude: float | None) -> float | None:
    """max |A - B| over cases in eps32 units at the truth's M (inf: they differ structurally)."""
    cut = {c.name: (fixture.select_rows(tap, c, a[c.name][tap]) if tap in a.get(c.name, {}) else None,
                    fixture.select_rows(tap, c, b[c.name][tap]) if tap in b.get(c.name, {}) else None)
           for c in fixture.cases}
    if any(x is None or y is None for x, y in cut.values()):
        return None
    try:
        row = tap_budget("a", "-", tap, {c: x for c, (x, _) in cut.items()},
                         {c: np.asarray(y).astype(np.float64) for c, (_, y) in cut.items()})
    except (TypeError, ValueError):
        return math.inf
    if row.status != OK or row.max_abs is None:
        return math.inf
    if row.max_abs == 0.0:
        return 0.0
    return math.inf if not magnitude else row.max_abs / (EPS32 * magnitude)


def differential(
    fixture: Fixture, budget: list[BudgetRow], outputs: Mapping[tuple[str, str], BackendOutput],
    backends: tuple[str, str], precision: str,
) -> Differential:
    """The rows of the view for `backends` in `precision`, from a run's budget rows and kept outputs."""
    by_key = {(r.backend, r.tap): r for r in budget if r.backend == GOLDEN_FP32 or r.precision == precision}
    exact = rounded_once_taps(fixture)
    rows: list[DiffRow] = []
    a_name, b_name = backends
    for tap in fixture.tap_names:
        golden_row = by_key.get((GOLDEN_FP32, tap))
        golden = _units(golden_row)
        units = {name: _units(by_key.get((name, tap))) for name in backends}
        magnitude = golden_row.magnitude if golden_row is not None else None
        between = None
        if units[a_name] is not None and units[b_name] is not None:
            between = _between(fixture, tap, outputs[(a_name, precision)], outputs[(b_name, precision)], magnitude)
        row = DiffRow(tap, magnitude, golden, tap in exact, units, between)
        if row.rounded_once and golden is not None:
            for name, peer in ((a_name, b_name), (b_name, a_name)):
                mine, theirs = units[name], units[peer]
                if mine is not None and theirs is not None and mine > golden >= theirs:
                    row.flagged.append(name)
        rows.append(row)
    return Differential(backends, precision, rows)


def _num(x: float | None) -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "FAIL"
    return "0" if x == 0 else f"{x:.2g}"


def format_differential(diff: Differential) -> list[str]:
    """The view as text: a row per tap (eps32 units), '*' on a flagged cell, then one line per flag."""
    a, b = diff.backends
    width = max((len(r.tap) for r in diff.rows), default=10)
    cols = [GOLDEN_FP32, a, b, f"{a} - {b}"]
    widths = [max(len(c), 11) for c in cols]
    lines = [f"{a} vs {b}, {diff.precision} results: error against the float64 truth (golden.fp64) per tap, "
             "max over cases, in eps32 units at the tap's M = max |truth| ('=' : golden.fp32 is the truth "
             "rounded once there; '*' : flagged)",
             f"{'tap':<{width}}    " + "  ".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True))]
    for r in diff.rows:
        cells = [_num(r.golden), *(_num(r.units[n]) + ("*" if n in r.flagged else "") for n in (a, b)),
                 _num(r.between)]
        mark = "=" if r.rounded_once else " "
        lines.append(f"{r.tap:<{width}}  {mark} " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths,
                                                                                           strict=True)))
    for name, r in diff.flags:
        peer = b if name == a else a
        lines.append(f"flagged: {name} at {r.tap}: {_num(r.units[name])} eps32 units where golden.fp32, the "
                     f"truth rounded once, is {_num(r.golden)} and {peer} is {_num(r.units[peer])}: "
                     "worse than float32 rounding (a float32 shortcut, e.g. positions computed in float32)")
    return lines
