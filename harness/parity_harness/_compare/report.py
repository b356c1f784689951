"""What a run produces, as plain data: each backend run and the Report the views render.

A Report is built by the runner from live backends (`parity_harness._run.runner.run_parity`), from saved
outputs (`parity_harness._run.dump.compare_dumps`) or from JSON reports (`parity_harness._run.merge.merge_reports`); the
views (report, junit, markdown, plots) read it and never import the runner. The per-tensor and
per-tap results it holds are `parity_harness._compare.judge`'s, the budget rows `parity_harness._compare.budget`'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from parity_harness._compare.budget import BudgetRow
from parity_harness._compare.judge import NOT_SUPPORTED, CheckResult, FirstDivergence, TapSummary
from parity_harness._compare.stored import StoredRun
from parity_harness._compare.tree import BackendRun as BackendRun  # re-exported: where every caller finds it
from parity_harness._compare.tree import ReportTree, build_tree
from parity_harness._core.precision import BackendOutput
from parity_harness._core.status import RunStatus, Verdict

if TYPE_CHECKING:
    from parity_harness._compare.decoding import DecodingReport
    from parity_harness._compare.gradients import GradReport
    from parity_harness._core.errors import ParityError


def read_from(paths: Iterable[str | os.PathLike[str]], what: str) -> dict[str, str]:
    """`{path: what}` for each of `paths`, for `Report.read_from`: each path absolute, symlinks resolved."""
    return {os.path.realpath(path): what for path in paths}


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
    fixture_id: str = ""  # the fixture's content hash (parity_harness/_fixture/identity.py), "" when not computed
    # The taps each (backend, precision) declared: what a dump of its output holds. Not written to JSON.
    supported: dict[tuple[str, str], list[str]] = field(default_factory=dict, repr=False)
    # The decoding check (parity_harness/_run/decode_check.py); None when no decoding was attempted (dumps, merges).
    decoding: DecodingReport | None = None
    # The backward and training check (`parity run --grad`, parity_harness/_run/grad_check.py); None when not asked.
    grad: GradReport | None = None
    # The error a backend stopped the run with (its run is listed with status CRASHED). Not written to JSON.
    crash: ParityError | None = field(default=None, repr=False)
    # The likely cause of each case's first failing tap, by (backend, precision, golden, case, tap)
    # (parity_harness/_compare/diagnose.py); copied onto the first divergences. Not written to JSON.
    causes: dict[tuple[str, str, str, str, str], str] = field(default_factory=dict, repr=False)
    # What the report was made from, absolute (symlinks resolved when it was made) -> what it is: the fixture
    # directory, the dumps judged, the reports merged. `api.render(path=...)` never writes over one. Not in JSON.
    read_from: dict[str, str] = field(default_factory=dict, repr=False)
    # A browser or Node process killed by a signal and restarted once, its backend run again, one line each
    # ("BACKEND: WHAT was killed by SIGNAL; restarted once and run again"; _backends/sessions.py)
    restarts: list[str] = field(default_factory=list)
    # The backends asked for by name (`--backends`, the API's backends): each must compare something, or the
    # verdict is NOTHING_COMPARED (parity_harness/_run/request.py). Empty for the default selection.
    named: list[str] = field(default_factory=list)
    # Registered plugins the default selection could not load, one line each ("NAME: its error"): the others ran,
    # and the verdict is CRASHED (exit 2), never a pass (parity_harness/_run/request.py, `select_backends`).
    broken: list[str] = field(default_factory=list)
    # Each stored weight format's run (f16, q8_0, ...): per tap the runtime's error and the format's own cost, in
    # units of eps * M_tap (parity_harness/_compare/stored.py); the second is informational, never a verdict.
    stored: list[StoredRun] = field(default_factory=list)
    # What each backend that ran says it computed with, one line (`Backend.build_info`: a native library's build
    # and the CPU features it uses), by backend; sanitized at the boundary.
    builds: dict[str, str] = field(default_factory=dict)
    # Where inside a first diverging tap the divergence starts, one line, by (backend, precision, tap)
    # (`Backend.locate_op`: a graph's node); copied onto the first divergences' `op`. Not in JSON itself.
    ops: dict[tuple[str, str, str], str] = field(default_factory=dict, repr=False)
    # What stood for each tap, by backend, where a backend says (`Backend.tap_sources`: a user's ONNX graph's
    # tensors, matched by value): {backend: {tap: "tensor (op node; how found)"}}; the taps absent were not computed.
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    # The report as a tree (`tree`), built on first use; from then on the Report is frozen. Not in JSON.
    _tree: ReportTree | None = field(default=None, init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_tree", None) is not None:
            raise AttributeError(f"the report is finished (its tree was built): {name} cannot change")
        object.__setattr__(self, name, value)

    @property
    def tree(self) -> ReportTree:
        """The report as a tree (parity_harness/_compare/tree.py), built once, on first use; every view renders it.
        Building it finishes the Report: no field can be set after."""
        if self._tree is None:
            object.__setattr__(self, "_tree", build_tree(self))
        assert self._tree is not None
        return self._tree

    @property
    def n_decoding_failed(self) -> int:
        return self.decoding.n_failed if self.decoding is not None else 0

    @property
    def n_grad_failed(self) -> int:
        return self.grad.n_failed if self.grad is not None else 0

    def grad_uncompared(self) -> bool:
        """True when the gradient check was asked for and compared nothing (no backend has a backward)."""
        return self.grad is not None and self.grad.n_passed + self.grad.n_failed == 0

    @property
    def n_failed(self) -> int:
        return sum(1 for r in self.results if r.passed is False)

    @property
    def n_passed(self) -> int:
        return sum(1 for r in self.results if r.passed is True)

    @property
    def crashed(self) -> BackendRun | None:
        """The run a backend crashed in (the run stopped there), or None."""
        return next((r for r in self.runs if r.status == RunStatus.CRASHED), None)

    @property
    def passed(self) -> bool:
        return (self.n_failed == 0 and self.n_passed > 0 and self.n_decoding_failed == 0 and self.n_grad_failed == 0
                and self.crashed is None and not self.named_uncompared() and not self.broken
                and not self.grad_uncompared())

    def named_uncompared(self) -> list[str]:
        """Backends asked for by name that compared no tap in any tier (declined, or every tap 'not supported')."""
        compared = self.taps_compared()
        return [name for name in self.named if compared.get(name, (0, 0))[0] == 0]

    def nothing_compared_reason(self) -> str:
        """Why the verdict is NOTHING_COMPARED, one line: the backends that compared nothing and what they said."""
        if self.n_passed + self.n_failed and not self.named_uncompared() and self.grad_uncompared():
            assert self.grad is not None
            return (f"--grad: no backend run has a backward, so no gradient was compared (without one: "
                    f"{', '.join(self.grad.not_supported) or 'none'})")
        idle = self.named_uncompared() if self.n_passed + self.n_failed else [r.backend for r in self.runs]
        why = [f"{r.backend} {r.precision}: {r.message}" for r in self.runs if r.backend in idle and r.message]
        names = ", ".join(dict.fromkeys(idle))
        head = (f"nothing was compared for backend(s) asked for by name: {names}" if self.n_passed + self.n_failed
                else "nothing was compared: every tap of every backend run was 'not supported'")
        return head + (f" ({'; '.join(why)})" if why else "")

    def __bool__(self) -> bool:
        """A Report is truthy exactly when it passes (`passed`, `verdict` AGREE): false on a disagreement
        and when nothing was compared, so `assert report` never passes on nothing."""
        return self.passed

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
    def verdict(self) -> Verdict:
        """AGREE, DISAGREE, NOTHING_COMPARED (no check compared at all: never a silent pass), or CRASHED."""
        if self.crashed is not None or self.broken:  # a plugin that failed to load: never a pass
            return Verdict.CRASHED
        if self.n_passed + self.n_failed == 0 or self.named_uncompared():
            return Verdict.NOTHING_COMPARED
        if self.n_failed or self.n_decoding_failed or self.n_grad_failed:
            return Verdict.DISAGREE
        return Verdict.NOTHING_COMPARED if self.grad_uncompared() else Verdict.AGREE
