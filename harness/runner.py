"""Run backends on a fixture and compare every tap in every tier they compute in.

Tiers: a backend's float32 results are compared with the float32 golden at the fp32 tolerance;
its float64 results with the float64 golden at the fp64 tolerance and, at the fp32 tolerance,
with the float32 golden too (the golden is upcast to float64 for that comparison).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.backends.base import PRECISIONS, Backend, BackendOutput, Precision
from harness.budget import BudgetRow, budget_rows, reference_rows
from harness.compare import (
    NOT_SUPPORTED,
    CheckResult,
    FirstDivergence,
    TapSummary,
    check_result,
    compare_tensors,
    first_divergence,
    name_index,
    summarize_tap,
)
from harness.errors import EXIT_BAD_INPUT, EXIT_DISAGREE, EXIT_OK, BackendFailed
from harness.fixture import Fixture
from harness.guard import call_backend, one_line
from harness.registry import checked_supported_taps
from reference.taps import tap_shape_template

if TYPE_CHECKING:
    from harness.decode_check import DecodingReport


def tiers_for(precision: Precision) -> list[Precision]:
    """The golden files a result of `precision` is compared with, in report order."""
    return ["fp32"] if precision == "fp32" else ["fp64", "fp32"]


@dataclass
class BackendRun:
    backend: str
    precision: str
    seconds: float
    status: str  # "ran" or "not_supported" (a backend that fails stops the run: BackendFailed, exit 2)
    message: str = ""


@dataclass
class Report:
    fixture: str
    results: list[CheckResult] = field(default_factory=list)
    summaries: list[TapSummary] = field(default_factory=list)
    divergences: list[FirstDivergence] = field(default_factory=list)
    runs: list[BackendRun] = field(default_factory=list)
    budget: list[BudgetRow] = field(default_factory=list)  # every result against the float64 truth
    measure_budget: bool = field(default=True, repr=False)  # False: leave `budget` empty (nothing shows it)
    skipped: list[str] = field(default_factory=list)  # registered backends not run: missing dependencies
    tolerances: dict[str, Any] = field(default_factory=dict)  # Fixture.tolerance_summary(): in force, loose
    # What each backend returned, by (backend, precision): {case: {tap: array}}. Not written to JSON.
    outputs: dict[tuple[str, str], BackendOutput] = field(default_factory=dict, repr=False)
    fixture_id: str = ""  # the fixture's content hash (harness/fixture_id.py), "" when not computed
    # The taps each (backend, precision) declared: what a dump of its output holds. Not written to JSON.
    supported: dict[tuple[str, str], list[str]] = field(default_factory=dict, repr=False)
    # The decoding check (harness/decode_check.py); None when no decoding was attempted (dumps, merges).
    decoding: DecodingReport | None = None

    @property
    def n_decoding_failed(self) -> int:
        return self.decoding.n_failed if self.decoding is not None else 0

    @property
    def n_failed(self) -> int:
        return sum(1 for r in self.results if r.passed is False)

    @property
    def n_passed(self) -> int:
        return sum(1 for r in self.results if r.passed is True)

    @property
    def passed(self) -> bool:
        return self.n_failed == 0 and self.n_passed > 0 and self.n_decoding_failed == 0

    def taps_compared(self) -> dict[str, tuple[int, int]]:
        """Per backend (in run order): how many taps were compared in any tier, of the fixture's taps."""
        compared: dict[str, set[str]] = {}
        every: dict[str, set[str]] = {}
        for r in self.results:
            every.setdefault(r.backend, set()).add(r.tap)
            taps = compared.setdefault(r.backend, set())
            if r.status != NOT_SUPPORTED:
                taps.add(r.tap)
        return {b: (len(compared[b]), len(every[b])) for b in compared}

    @property
    def loose(self) -> bool:
        """True when the fixture's tolerances exceed their ceilings (--allow-loose-tolerances)."""
        return bool(self.tolerances.get("loose"))

    @property
    def exit_code(self) -> int:
        if self.n_passed + self.n_failed == 0:
            return EXIT_BAD_INPUT  # nothing compared at all: never a silent pass
        return EXIT_DISAGREE if self.n_failed or self.n_decoding_failed else EXIT_OK


def validate_output(backend: Backend, fixture: Fixture, output: object, supported: list[str]) -> BackendOutput:
    """Check the structure of a backend's output (not its numbers) and take a private copy of it.

    As strict as `parity check-backend`: a dict with exactly the fixture's cases, each a dict of
    declared taps only, each a numpy.ndarray (not a list, not a subclass). BackendFailed (exit 2)
    otherwise. A declared tap that is missing, or an array of the wrong shape, dtype or with NaN,
    is left to the comparison: a failed check (exit 1) at that tap. The arrays are copied, so the
    backend cannot change them after the comparison (nor see them change).
    """
    name = backend.name
    if not isinstance(output, dict):
        raise BackendFailed(f"backend {name!r} returned {type(output).__name__}, expected a dict by case")
    cases = dict(dict.items(output))  # the dict's own items, whatever a subclass overrides
    known = {c.name for c in fixture.cases}
    unknown = [c for c in cases if c not in known]
    if unknown:
        raise BackendFailed(f"backend {name!r} returned an unknown case {one_line(repr(unknown[0]))[:80]} "
                            f"(the fixture's cases: {len(known)})")
    missing = [c.name for c in fixture.cases if c.name not in cases]
    if missing:
        raise BackendFailed(f"backend {name!r} returned no result for case {missing[0]!r}")
    copied: BackendOutput = {}
    declared = set(supported)
    for case in fixture.cases:
        taps = cases[case.name]
        if not isinstance(taps, dict):
            raise BackendFailed(f"backend {name!r}, case {case.name!r}: expected a dict by tap")
        copied[case.name] = {}
        for tap, array in dict.items(taps):
            if tap not in declared:
                raise BackendFailed(f"backend {name!r}, case {case.name!r}: returned tap "
                                    f"{one_line(repr(tap))[:80]}, which it does not declare in supported_taps")
            if type(array) is not np.ndarray:
                raise BackendFailed(f"backend {name!r}, {case.name}/{tap}: returned {type(array).__name__}, "
                                    "expected numpy.ndarray")
            copied[case.name][tap] = np.array(array, copy=True)
    return copied


def compare_output(
    name: str, fixture: Fixture, precision: Precision, output: BackendOutput, supported: list[str]
) -> list[CheckResult]:
    """Every case x tap x tier of one output of backend `name` (run live or read from a dump), in dataflow order."""
    results: list[CheckResult] = []
    for golden_tier in tiers_for(precision):
        golden = fixture.golden(golden_tier)
        tolerances = fixture.tolerances[golden_tier]
        for case in fixture.cases:
            for tap in fixture.tap_names:
                tol = tolerances.for_tap(tap)
                if tap not in supported:
                    results.append(CheckResult(name, precision, golden_tier, case.name, tap,
                                               NOT_SUPPORTED, None, tol.atol, tol.rtol))
                    continue
                expected = golden[case.name][tap]
                actual = output[case.name].get(tap)
                if actual is None:
                    results.append(CheckResult(
                        name, precision, golden_tier, case.name, tap, "fail", False, tol.atol, tol.rtol,
                        message="missing: the backend declares this tap but did not return it",
                    ))
                    continue
                if golden_tier != precision:  # float64 result against the float32 golden, in float64
                    expected = expected.astype(np.float64)
                cmp = compare_tensors(np.asarray(actual), expected, tol.atol, tol.rtol)
                results.append(check_result(name, precision, golden_tier, case.name, tap, cmp,
                                            tol.atol, tol.rtol))
    return results


def summarize(results: list[CheckResult], tap_order: list[str]) -> tuple[list[TapSummary], list[FirstDivergence]]:
    """Per-tap summaries (worst over cases) and first divergences, per backend x precision x golden."""
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


Progress = Callable[[str], None]


def run_backend(backend: Backend, fixture: Fixture, precision: Precision) -> tuple[list[str], BackendOutput]:
    """A backend's declared taps and its checked output; any failure stops the run with one line.

    The backend gets `fixture.for_backend()`, a private copy whose arrays are read-only, so it
    cannot change what the comparison reads. Whatever it raises becomes one line, exit 2
    (harness/guard.py); what it returns is checked by `validate_output`.
    """
    supported = checked_supported_taps(backend, fixture)
    view = fixture.for_backend()
    output = call_backend(backend.name, f"run ({precision})", lambda: backend.run(view, precision))
    return supported, call_backend(backend.name, f"its output ({precision})",
                                   lambda: validate_output(backend, fixture, output, supported))


def run_parity(
    fixture: Fixture,
    backends: list[Backend],
    precisions: list[Precision] | None = None,
    progress: Progress | None = None,
    decoding: bool = True,
    budget: bool = True,
) -> Report:
    """Run every backend in every requested precision it supports, and compare.

    `budget`: also measure every result against the float64 truth (the error budget, `--budget`
    and the JSON report show it); False skips that work.

    Then, unless `decoding` is False, the decoding check of every backend that supports it
    (harness/decode_check.py), when the fixture has decoding goldens.
    """
    wanted = precisions or list(PRECISIONS)
    report = Report(str(fixture.root), tolerances=fixture.tolerance_summary(), measure_budget=budget)
    say = progress or (lambda _msg: None)
    for backend in backends:
        for precision in wanted:
            if precision not in backend.precisions:
                report.runs.append(BackendRun(backend.name, precision, 0.0, NOT_SUPPORTED,
                                              f"computes in {', '.join(backend.precisions)} only"))
                continue
            say(f"parity: running {backend.name} ({precision}) ...")
            start = time.perf_counter()
            supported, output = run_backend(backend, fixture, precision)
            seconds = time.perf_counter() - start
            report.runs.append(BackendRun(backend.name, precision, seconds, "ran"))
            add_output(report, fixture, backend.name, precision, output, supported)
    if decoding:
        from harness.decode_check import run_decoding

        report.decoding = run_decoding(fixture, backends, wanted, say)
    finish_report(report, fixture)
    return report


def add_output(
    report: Report, fixture: Fixture, name: str, precision: Precision, output: BackendOutput, supported: list[str]
) -> None:
    """Judge one (backend, precision) output against the goldens, whatever produced it, into `report`.

    `run_parity` calls it for each live backend run, `harness.dump.compare_dumps` for each dump.
    """
    report.results += compare_output(name, fixture, precision, output, supported)
    report.outputs[(name, precision)] = output
    report.supported[(name, precision)] = list(supported)
    if report.measure_budget:
        report.budget += budget_rows(fixture, name, precision, output, supported)


def finish_report(report: Report, fixture: Fixture) -> None:
    """After every `add_output`: per-tap summaries, first divergences named by axis, the budget's reference rows."""
    report.summaries, report.divergences = summarize(report.results, fixture.tap_names)
    name_divergences(report.divergences, fixture)
    if report.measure_budget:
        report.budget = reference_rows(fixture) + report.budget
    if not report.fixture_id:
        from harness.fixture_id import fixture_id

        report.fixture_id = fixture_id(fixture)


def name_divergences(divergences: list[FirstDivergence], fixture: Fixture) -> None:
    """Fill each divergence's `location` and `axes`: its worst cell named by axis, with the words."""
    for d in divergences:
        if d.index is None:
            continue
        template = tap_shape_template(fixture.config, d.tap)
        d.location, d.axes = name_index(d.tap, template, d.index, fixture.case(d.case).tokens, fixture.vocab,
                                        fixture.config.n_head, fixture.config.d_mlp)
