"""Run backends on a fixture and compare every tap in every tier they compute in.

Tiers: a backend's float32 results are compared with the float32 golden at the fp32 tolerance;
its float64 results with the float64 golden at the fp64 tolerance and, at the fp32 tolerance,
with the float32 golden too (the golden is upcast to float64 for that comparison); its fp16 and bf16
results with both goldens at the per-tap rule c * eps * M_tap (`Fixture.reduced_tolerance`); a stored weight format's
(f16, q8_0, q4_0, q4_k) with the goldens of the weights it stores, one tier, at its own per-tap rule
(parity_harness/_fixture/stored_goldens.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import math
import sys
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from parity_harness._backends import sessions
from parity_harness._backends.base import BackendOutput, Precision
from parity_harness._backends.boundary import AnyBackend, GuardedBackend, guarded
from parity_harness._backends.guard import one_line
from parity_harness._compare.budget import (
    BudgetAccumulator,
    SystematicAccumulator,
    SystematicRow,
    reference_rows,
)
from parity_harness._compare.judge import (
    FAIL,
    NOT_SUPPORTED,
    SYSTEMATIC_CASE,
    CheckResult,
    FirstDivergence,
    fold,
    judge_tensor,
    name_index,
)
from parity_harness._compare.report import BackendRun, Report, read_from
from parity_harness._compare.stored import stored_run
from parity_harness._core.errors import ParityError
from parity_harness._core.precision import DEFAULT_PRECISIONS, EPS, is_reduced, is_stored, tiers_for
from parity_harness._core.status import RunStatus
from parity_harness._fixture.fixture import Case, Fixture
from parity_harness._fixture.stored_goldens import stored_goldens
from parity_harness._fixture.tolerances import FP32_ATOL, FP64_ATOL, STORED_C, SYSTEMATIC_BOUND


def compare_case(
    name: str, fixture: Fixture, precision: Precision, case: Case, taps: dict[str, np.ndarray],
    supported: list[str], golden_tier: Precision, golden: dict[str, np.ndarray],
) -> list[CheckResult]:
    """One case of one output, every tap against one golden tier, in dataflow order.

    A tap the golden keeps only the last positions of ("rows") is cut the same way when the backend
    returned every position.
    """
    tolerances = fixture.tolerances[golden_tier]
    stored = stored_goldens(fixture, precision) if is_stored(precision) else None
    results: list[CheckResult] = []
    for tap in fixture.tap_names:  # fp16, bf16: the per-tap rule c * eps * M_tap, the same in both tiers
        if stored is not None:  # a stored format: its own per-tap rule, against the goldens of its weights
            tol = stored.tolerance(tap)
        else:
            tol = fixture.reduced_tolerance(precision, tap) if is_reduced(precision) else tolerances.for_tap(tap)
        if tap not in supported:
            results.append(CheckResult(name, precision, golden_tier, case.name, tap, NOT_SUPPORTED, None,
                                       tol.atol, tol.rtol))
            continue
        actual = taps.get(tap)
        if actual is not None:
            actual = fixture.select_rows(tap, case, actual)
        results.append(judge_tensor(name, precision, golden_tier, case.name, tap, actual, golden[tap],
                                    tol.atol, tol.rtol))
    return results


Progress = Callable[[str], None]


@sessions.closing  # what backends keep for a run (one Chromium for the browser backends) ends with it
def run_parity(
    fixture: Fixture,
    backends: Sequence[AnyBackend],
    precisions: list[Precision] | None = None,
    progress: Progress | None = None,
    keep_outputs: bool = True,
    decoding: bool = True,
    budget: bool = True,
    keep_on_crash: bool = False,
    jobs: int | None = None,
    grad: bool = False,
) -> Report:
    """Run every backend in every requested precision it supports, and compare.

    Each case is compared as it comes and, unless `keep_outputs` (what `--save-outputs` needs), dropped:
    with a streaming backend and a large fixture, memory holds one case of one backend.
    `budget`: also measure every result against the float64 truth (the error budget, `--budget`
    and the JSON report show it); False skips that work.

    `jobs`: how many backends may run at once (lanes.py: the main thread and worker threads, a backend that
    declares `concurrent` on a worker; default one, lanes.DEFAULT_JOBS). The report is the same
    whatever it is: each backend's runs and checks are collected on their own and added in the run's order.

    A backend that fails mid-run (any ParityError from its code or about what it returned) stops the run
    with that error; with `keep_on_crash` (`parity run`) the report is returned instead: its run is
    recorded with status CRASHED and the error in `report.crash`, the backends before it keep
    their results, and the report's verdict is CRASHED (exit 2, never a pass). Progress: one line per
    backend x precision, and one per case for a backend that streams (`run_cases`).

    Then, unless `decoding` is False, the decoding check of every backend that supports it
    (parity_harness/_run/decode_check.py), when the fixture has decoding goldens; and with `grad`, the backward
    and the training steps of every backend that has them (parity_harness/_run/grad_check.py).
    """
    from parity_harness._run.lanes import lanes_for, run_in_lanes

    wanted = precisions or list(DEFAULT_PRECISIONS)
    guards = [guarded(b) for b in backends]
    report = Report(str(fixture.root), tolerances=fixture.tolerance_summary(), measure_budget=budget,
                    read_from=read_from([fixture.root], "the fixture directory"))
    say = progress or (lambda _msg: None)
    release = fixture.parameter_count() >= RELEASE_PARAMETERS
    lanes = lanes_for(jobs, guards, small=not release)

    with survivors_frozen(release and lanes.total == 1) as freeze:

        def run_one(backend: GuardedBackend) -> BackendResult:
            own = Report(report.fixture, measure_budget=budget)
            try:
                _run_backend(own, fixture, backend, wanted, say, keep_outputs, budget, release)
            except ParityError as exc:  # raised from backend code or about it: the run stops
                own.crash = exc
            if release:
                release_memory(freeze)
            return own

        results = run_in_lanes(guards, run_one, lambda own: own.crash is not None, lanes)
    for own in results:
        add_backend_result(report, own)
        if own.crash is not None:
            if not keep_on_crash:
                raise own.crash
            report.crash = own.crash
    # Decoding and the backward have goldens of the fixture's own weights only: a stored weight format is judged
    # on the forward pass, against the goldens of the weights it stores.
    own_weights = [p for p in wanted if not is_stored(p)]
    if decoding and report.crash is None and own_weights:
        from parity_harness._run.decode_check import run_decoding

        report.decoding = run_decoding(fixture, guards, own_weights, say)
    if grad and report.crash is None and own_weights:
        from parity_harness._run.grad_check import run_gradients

        report.grad = run_gradients(fixture, guards, own_weights, say, release_memory)
    finish_report(report, fixture)
    return report


# One backend's runs and checks, made apart from the run's report (it may run beside other backends, lanes.py)
# and added to it in the run's order by `add_backend_result`; its `crash` is the error that stopped it.
BackendResult = Report


def add_backend_result(report: Report, own: BackendResult) -> None:
    """Add one backend's runs, checks, budget rows, causes, declared taps and kept outputs to the run's report."""
    report.runs += own.runs
    report.results += own.results
    report.budget += own.budget
    report.causes.update(own.causes)
    report.supported.update(own.supported)
    report.outputs.update(own.outputs)
    report.stored += own.stored
    report.builds.update(own.builds)
    report.ops.update(own.ops)
    report.sources.update(own.sources)


def _run_backend(report: Report, fixture: Fixture, backend: GuardedBackend, wanted: list[Precision],
                 say: Progress, keep_outputs: bool, budget: bool, release: bool) -> None:
    """One backend in every wanted precision; a ParityError from its code is recorded as a CRASHED run and
    re-raised (the runs before it stay in the report, judged). `release`: memory is handed back between its
    precisions (`release_memory`; after the last, the caller does it)."""
    precision: Precision = wanted[0]
    clock = [0.0]
    try:
        declined = backend.declined(fixture)
        computed = [] if declined else [p for p in wanted if p in backend.precisions]
        for precision in wanted:
            if precision not in backend.precisions:
                report.runs.append(BackendRun(backend.name, precision, 0.0, RunStatus.NOT_SUPPORTED,
                                              f"computes in {', '.join(backend.precisions)} only"))
                continue
            if declined:
                report.runs.append(BackendRun(backend.name, precision, 0.0, RunStatus.NOT_SUPPORTED, declined))
                continue
            say(f"parity: running {backend.name} ({precision}) ...")
            supported = backend.taps(fixture)
            clock = [0.0]
            judge = CaseJudge(fixture, backend.name, precision, supported, budget)
            n = len(fixture.cases)
            for k, (case, taps) in enumerate(backend.forward(fixture, precision, supported, clock), 1):
                if backend.entry == "run_cases":  # streaming: each case as it comes (from `run`: all at once)
                    say(f"parity: {backend.name} {precision}: case {k}/{n} ({case.name})")
                judge.add(case, taps)
                if keep_outputs:
                    report.outputs.setdefault((backend.name, precision), {})[case.name] = taps
                del taps
            report.runs.append(BackendRun(backend.name, precision, clock[0], RunStatus.RAN))
            judge.finish(report)
            if backend.name not in report.builds:
                build = backend.build_info()
                if build:
                    report.builds[backend.name] = build
            if backend.name not in report.sources:
                sources = backend.tap_sources(fixture)
                if sources is not None:
                    report.sources[backend.name] = sources
            _locate_first_op(report, fixture, backend, precision)
            if release and precision != computed[-1]:
                release_memory()  # between its precisions; after the last, run_parity's run_one does it
    except ParityError as exc:
        report.runs.append(BackendRun(backend.name, precision, clock[0], RunStatus.CRASHED, one_line(str(exc))))
        raise


def _locate_first_op(report: Report, fixture: Fixture, backend: GuardedBackend, precision: Precision) -> None:
    """Ask the backend where inside its first failing tap (dataflow order; the first case failing there) the
    divergence starts (`locate_op`): one line kept by (backend, precision, tap), for the first divergence."""
    order = {t: i for i, t in enumerate(fixture.tap_names)}
    failing = [r for r in report.results if r.backend == backend.name and r.precision == precision
               and r.status == FAIL and r.tap in order and r.case != SYSTEMATIC_CASE]
    if not failing:
        return
    first = min(failing, key=lambda r: order[r.tap])
    where = backend.locate_op(fixture, precision, first.case, first.tap)
    if where:
        report.ops[(backend.name, precision, first.tap)] = where


# From this many parameters on, each backend run is followed by `release_memory`. Below it the freed
# memory is small, and a full garbage collection with torch loaded costs ~0.3 s per backend x precision.
RELEASE_PARAMETERS = 1_000_000


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, for malloc_trim; None elsewhere (`find_library` runs ldconfig: looked up once)."""
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def release_memory(freeze: bool = False) -> None:
    """After a backend run: hand the memory it freed back to the OS (glibc keeps freed blocks of up to
    32 MB in its heap, so a GPT-2-sized backend's arrays would stay in the RSS of the next one).

    `freeze` (inside `survivors_frozen`): what survives the collection is moved out of the collector's
    reach, so the next collection scans only what was made since."""
    gc.collect()
    if freeze:
        gc.freeze()
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(AttributeError):  # not glibc (musl has no malloc_trim): nothing to do
            libc.malloc_trim(0)


@contextlib.contextmanager
def survivors_frozen(wanted: bool) -> Iterator[bool]:
    """While a large fixture's backends run one at a time: let `release_memory` freeze what outlives each
    backend (modules, the fixture, the report), and unfreeze it all at the end. A full collection with torch,
    transformers and TransformerLens imported scans ~430,000 objects, 0.2 s, once per backend and precision
    (14 times in a gpt2-small run); frozen, those are not scanned again. Yields whether it is on: not with two
    lanes (a backend still running beside would be frozen, its garbage kept to the end of the run), nor when
    objects were frozen before (the caller's: unfreezing them is not parity's to do)."""
    on = wanted and gc.get_freeze_count() == 0
    try:
        yield on
    finally:
        if on:
            gc.unfreeze()


class CaseJudge:
    """Judges one (backend, precision) output case by case: tier results, the aggregate rule and the budget,
    then `finish`."""

    def __init__(self, fixture: Fixture, name: str, precision: Precision, supported: list[str],
                 budget: bool = True) -> None:
        self.fixture, self.name, self.precision, self.supported = fixture, name, precision, supported
        self.by_tier: dict[Precision, list[CheckResult]] = {tier: [] for tier in tiers_for(precision)}
        self.budget = BudgetAccumulator(name, precision, fixture.tap_names, supported) if budget else None
        # The aggregate rule against the float64 truth (docs/tolerances.md, "Systematic error"), always judged.
        self.systematic = SystematicAccumulator(name, precision, EPS[precision], fixture.tap_names, supported,
                                                systematic_allowance(fixture, precision))
        self.causes: dict[tuple[str, str, str], str] = {}  # (tier, case, tap) -> its likely cause

    def add(self, case: Case, taps: dict[str, np.ndarray]) -> None:
        """Compare one case in each tier, one golden tier in memory at a time; add it to the aggregate rule's
        sums and the budget."""
        cut = {t: self.fixture.select_rows(t, case, a) for t, a in taps.items() if a is not None}
        # The budget's truth is the float64 golden, its magnitudes measured once per fixture, not per backend.
        magnitudes = self.fixture.golden_magnitudes("fp64", case.name) if self.budget is not None else None
        if "fp64" not in self.by_tier:
            truth = self.fixture.golden_case("fp64", case.name, self.supported)
            self.systematic.add_case(cut, truth)
            if self.budget is not None:
                self.budget.add_case(case.name, cut, truth, magnitudes)
            del truth
        for tier in self.by_tier:  # the goldens of the taps the backend declares: no other is compared
            golden = self.golden(tier, case)
            results = compare_case(self.name, self.fixture, self.precision, case, taps, self.supported, tier, golden)
            self.by_tier[tier] += results
            self.diagnose_first(case, taps, tier, golden, results)
            if tier == "fp64":
                self.systematic.add_case(cut, golden)
                if self.budget is not None:
                    self.budget.add_case(case.name, cut, golden, magnitudes)
            del golden

    def golden(self, tier: Precision, case: Case) -> dict[str, np.ndarray]:
        """The golden taps a case is judged against: the fixture's tier, or for a stored weight format the goldens
        of the weights it stores (their float64 truth)."""
        if is_stored(self.precision):
            own = stored_goldens(self.fixture, self.precision).case(case.name)
            return {tap: own[tap] for tap in self.supported}
        return self.fixture.golden_case(tier, case.name, self.supported)

    def diagnose_first(self, case: Case, taps: dict[str, np.ndarray], tier: Precision,
                       golden: dict[str, np.ndarray], results: list[CheckResult]) -> None:
        """Name the likely cause at this case's first failing tap in this tier (_compare/diagnose.py): the
        only place a first divergence can be, so one diagnosis per failing case and tier, not per check."""
        failing = next((r for r in results if r.status == FAIL), None)
        if failing is None or is_stored(self.precision):  # the known-bug patterns read the fixture's own goldens
            return
        from parity_harness._compare.diagnose import diagnose
        from parity_harness._compare.patterns import TapContext

        tap, fx = failing.tap, self.fixture
        actual = taps.get(tap)
        if actual is None:
            return
        other: Precision = "fp32" if tier == "fp64" else "fp64"
        golden_other = fx.golden_tap(other, case.name, tap)
        truth, golden32 = (golden[tap], golden_other) if tier == "fp64" else (golden_other, golden[tap])
        place = fx.tap_names.index(tap)
        before = fx.tap_names[place - 1] if place else None
        previous = None if before is None else golden.get(before)
        if before is not None and previous is None:  # a tap the backend does not declare: its golden read on its own
            previous = fx.golden_tap(tier, case.name, before)
        causes = diagnose(fx.select_rows(tap, case, actual), golden[tap], tier, atol=failing.atol, rtol=failing.rtol,
                          truth=truth, golden32=golden32, previous=previous,
                          position_axis=fx.model.rows_axis(tap),
                          context=TapContext(tap, fx.model.config, golden, {t: fx.select_rows(t, case, a)
                                                                            for t, a in taps.items() if a is not None},
                                             fx.weights(), self.precision))
        if causes:
            self.causes[(tier, case.name, tap)] = "; ".join(causes)

    def systematic_checks(self) -> list[CheckResult]:
        """One failing check per tap whose aggregate error is beyond its bound (`SYSTEMATIC_BOUND`) while every
        cell of it passed, in the precision's first tier, case `SYSTEMATIC_CASE`; any other tap adds nothing."""
        tier = tiers_for(self.precision)[0]
        bound = SYSTEMATIC_BOUND[self.precision]
        out = []
        failed = {r.tap for results in self.by_tier.values() for r in results if r.status == FAIL}
        for row in self.systematic.rows():  # a tap failing per cell is failed already: the sum adds nothing to it
            message = None if row.tap in failed else systematic_message(row, bound)
            if message is None:
                continue
            at_tap = [r for r in self.by_tier[tier] if r.tap == row.tap and r.max_abs is not None]
            worst = max(at_tap, key=lambda r: r.max_abs or 0.0, default=None)
            atol, rtol = (worst.atol, worst.rtol) if worst is not None else (0.0, 0.0)
            out.append(CheckResult(self.name, self.precision, tier, SYSTEMATIC_CASE, row.tap, FAIL, False, atol, rtol,
                                   None if worst is None else worst.max_abs, None if worst is None else worst.max_rel,
                                   math.inf, message=message))
        return out

    def finish(self, report: Report) -> None:
        self.by_tier[tiers_for(self.precision)[0]] += self.systematic_checks()
        report.results += [r for results in self.by_tier.values() for r in results]
        report.causes.update({(self.name, self.precision, tier, c, tap): cause
                              for (tier, c, tap), cause in self.causes.items()})
        report.supported[(self.name, self.precision)] = list(self.supported)
        if self.budget is not None:
            report.budget += self.budget.rows()
        if is_stored(self.precision):  # per tap: the runtime's error and the format's own cost, in one unit
            own = stored_goldens(self.fixture, self.precision)
            report.stored.append(stored_run(
                self.name, self.precision, own.storage, STORED_C[self.precision], self.by_tier["fp64"],
                {tap: own.unit(tap) for tap in self.fixture.tap_names}, own.format_cost, self.fixture.tap_names))


EXPORTED_ATOL: dict[str, float] = {"fp32": FP32_ATOL, "fp64": FP64_ATOL}


def systematic_allowance(fixture: Fixture, precision: Precision) -> dict[str, float]:
    """{tap: max(1, its per-cell atol in force / the atol `parity export` writes for the tier)} in fp32 and fp64:
    a per-tap override (the fixture's measured budget at that tap) or a loosened default widens the aggregate
    bound as much as it widens each cell's; {} in the reduced precisions (their per-tap rule has no override)."""
    if is_reduced(precision) or is_stored(precision):
        return {}
    tolerances, default = fixture.tolerances[precision], EXPORTED_ATOL[precision]
    return {tap: max(1.0, tolerances.for_tap(tap).atol / default) for tap in fixture.tap_names}


def systematic_message(row: SystematicRow, bound: float) -> str | None:
    """Why a tap fails the aggregate rule, in one line (the larger of its gain and offset, in eps), or None when
    both are within `bound` eps per unit of the tap's own per-cell budget (`SystematicRow.allowance`)."""
    if row.units <= bound:
        return None
    unit = f"eps{row.precision.removeprefix('fp')}"
    what, value, units = max((("gain", row.gain, row.gain_eps), ("offset", row.offset, row.offset_eps)),
                             key=lambda x: x[2])
    scale = "" if what == "gain" else " x rms"
    limit = f"{bound:g} {unit}" if row.allowance == 1.0 else \
        f"{bound * row.allowance:.3g} {unit}: {bound:g} x the tap's atol / the exported default, {row.allowance:.3g}"
    return (f"systematic: {what} {value:+.1e}{scale} = {units:.3g} {unit} over {row.cells} cells of every case "
            f"(bound {limit}): each cell may pass, together they are a {what}")


def add_output(
    report: Report, fixture: Fixture, name: str, precision: Precision, output: BackendOutput, supported: list[str]
) -> None:
    """Judge one (backend, precision) output read from a dump, case by case, by the judge of live runs."""
    judge = CaseJudge(fixture, name, precision, supported, report.measure_budget)
    for case in fixture.cases:
        judge.add(case, output[case.name])
    judge.finish(report)
    report.outputs[(name, precision)] = output


def finish_report(report: Report, fixture: Fixture) -> None:
    """After every `add_output`: per-tap summaries, first divergences named by axis, the budget's reference rows."""
    report.summaries, report.divergences = fold(report.results, fixture.tap_names)
    name_divergences(report.divergences, fixture)
    for d in report.divergences:
        d.cause = report.causes.get((d.backend, d.precision, d.golden, d.case, d.tap), d.cause)
        d.op = report.ops.get((d.backend, d.precision, d.tap), d.op)
    if report.measure_budget:
        report.budget = reference_rows(fixture) + report.budget
    if not report.fixture_id:
        from parity_harness._fixture.identity import fixture_id

        report.fixture_id = fixture_id(fixture)


def name_divergences(divergences: list[FirstDivergence], fixture: Fixture) -> None:
    """Fill each divergence's `location` and `axes`: its worst cell named by axis, with the words."""
    for d in divergences:
        if d.index is None:
            continue
        rows = fixture.tap_rows.get(d.tap)
        if rows is not None:  # the golden keeps the last positions: index them as positions of the case
            axis, length = fixture.model.rows_axis(d.tap), len(fixture.case(d.case).tokens)
            d.index = [i + (length - min(rows, length)) if a == axis else i for a, i in enumerate(d.index)]
        d.location, d.axes = name_index(fixture.model.axis_names(d.tap), d.index, fixture.case(d.case).tokens,
                                        fixture.vocab)
