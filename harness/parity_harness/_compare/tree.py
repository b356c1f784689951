"""The report as a tree, built once and frozen: run -> backend x tier -> tap -> checks, first divergences at their tap.

`build_tree(report)` groups a finished Report (`parity_harness._compare.report`) once; every view (terminal,
JSON, JUnit, Markdown, plot) renders the tree it returns and regroups nothing. A tier's first divergence sits at
the tap it names (`TapNode.root`), and every other failing tap of that tier points at it (`TapNode.after`): a
consequence downstream of the root, which JUnit and the terminal say instead of repeating the failure. The
decoding check, when the run made one, is the same tree under `ReportTree.decoding`, and the gradient check
(`parity run --grad`) under `ReportTree.grad`. Nodes are frozen
dataclasses holding tuples: a view cannot change what another view renders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from parity_harness._compare.judge import FAIL, NOT_SUPPORTED, OK, CheckResult, FirstDivergence, TapSummary
from parity_harness._core.status import RunStatus, Verdict

if TYPE_CHECKING:
    from parity_harness._compare.decoding import DecodingReport, GreedyCheck
    from parity_harness._compare.gradients import GradReport


@dataclass
class BackendRun:
    """One backend x precision run of a report: how long it took and how it ended."""

    backend: str
    precision: str
    seconds: float
    status: RunStatus  # a backend that fails stops the run: status CRASHED (the error line in message), exit 2
    message: str = ""


class FinishedReport(Protocol):
    """What `build_tree` reads of a Report (parity_harness/_compare/report.py), which imports this module."""

    fixture: str
    results: list[CheckResult]
    summaries: list[TapSummary]
    divergences: list[FirstDivergence]
    runs: list[BackendRun]
    decoding: DecodingReport | None
    grad: GradReport | None

    @property
    def verdict(self) -> Verdict: ...


def used_share(s: TapSummary) -> float:
    """How much of its tolerance a tap used: min_atol / atol (> 1 fails); inf for a structural failure, -1 when
    nothing was measured (not supported)."""
    if s.min_atol is None:
        return -1.0 if s.status == NOT_SUPPORTED else math.inf
    if s.atol == 0:
        return math.inf if s.min_atol > 0 else 0.0
    return s.min_atol / s.atol


@dataclass(frozen=True)
class TapNode:
    """One tap of one tier: its summary (worst over cases), its checks, and where it stands in the tier's failure."""

    summary: TapSummary
    checks: tuple[CheckResult, ...]
    root: FirstDivergence | None = None  # the tier's first divergence, when it is at this tap
    after: str | None = None  # a failing tap downstream of the tier's first divergence: that divergence's tap

    @property
    def tap(self) -> str:
        return self.summary.tap

    @property
    def status(self) -> str:
        return self.summary.status

    @property
    def used(self) -> float:
        return used_share(self.summary)


@dataclass(frozen=True)
class TierNode:
    """One backend x precision x golden tier: its taps in dataflow order and its first divergence."""

    backend: str
    precision: str
    golden: str
    taps: tuple[TapNode, ...]
    divergence: FirstDivergence | None
    seconds: float  # the backend's run in this precision (0.0 when unknown: merged, or from a dump)

    @property
    def n_ok(self) -> int:
        return sum(1 for t in self.taps if t.status == OK)

    @property
    def n_failed(self) -> int:
        return sum(1 for t in self.taps if t.status == FAIL)

    @property
    def n_not_supported(self) -> int:
        return sum(1 for t in self.taps if t.status == NOT_SUPPORTED)

    @property
    def n_compared(self) -> int:
        return len(self.taps) - self.n_not_supported

    @property
    def worst(self) -> TapNode | None:
        """The compared tap that used most of its tolerance (the first such in dataflow order), or None."""
        compared = [t for t in self.taps if t.status != NOT_SUPPORTED]
        return max(compared, key=lambda t: t.used, default=None)

    @property
    def passed(self) -> bool:
        return self.n_failed == 0 and self.n_ok > 0


@dataclass(frozen=True)
class GreedyNode:
    """One backend x precision's greedy tokens, prompt by prompt, against the golden's."""

    backend: str
    precision: str
    rows: tuple[GreedyCheck, ...]


@dataclass(frozen=True)
class DecodingNode:
    """The decoding check as a tree: the same tiers for its taps (checked prompt x step), then greedy tokens."""

    source: DecodingReport  # prompts, steps, vocabulary and runs, as the check made them
    tiers: tuple[TierNode, ...]
    greedy: tuple[GreedyNode, ...]

    @property
    def divergences(self) -> tuple[FirstDivergence, ...]:
        return tuple(t.divergence for t in self.tiers if t.divergence is not None)


@dataclass(frozen=True)
class GradNode:
    """The gradient check as a tree: the backward's tiers (gradient names in backward order, checked per training
    case), then the training step's tiers (each step's records, by step)."""

    source: GradReport
    tiers: tuple[TierNode, ...]
    train_tiers: tuple[TierNode, ...]

    @property
    def divergences(self) -> tuple[FirstDivergence, ...]:
        return tuple(t.divergence for t in (*self.tiers, *self.train_tiers) if t.divergence is not None)


@dataclass(frozen=True)
class ReportTree:
    """A finished run: its forward tiers, its decoding tiers, its runs and verdict. Built by `build_tree`."""

    fixture: str
    verdict: Verdict
    tiers: tuple[TierNode, ...]
    decoding: DecodingNode | None
    runs: tuple[BackendRun, ...]
    grad: GradNode | None = None

    @property
    def divergences(self) -> tuple[FirstDivergence, ...]:
        """Every first divergence, forward tiers first, then decoding, then the backward and training, in run order."""
        forward = tuple(t.divergence for t in self.tiers if t.divergence is not None)
        return (forward + (self.decoding.divergences if self.decoding is not None else ())
                + (self.grad.divergences if self.grad is not None else ()))

    @property
    def first(self) -> FirstDivergence | None:
        """The first divergence the verdict names: the earliest tap over the forward tiers (the first tier's on a
        tie), else the first decoding divergence, else the first of the backward and training."""
        forward = [t for t in self.tiers if t.divergence is not None]
        if forward:
            order = {tap.tap: i for tier in self.tiers for i, tap in enumerate(tier.taps)}
            best = min(forward, key=lambda t: order.get(t.divergence.tap, 0) if t.divergence else 0)
            return best.divergence
        if self.decoding is not None and self.decoding.divergences:
            return self.decoding.divergences[0]
        return self.grad.divergences[0] if self.grad is not None and self.grad.divergences else None


def _tiers(summaries: list[TapSummary], checks: list[CheckResult], divergences: list[FirstDivergence],
           seconds: dict[tuple[str, str], float]) -> tuple[TierNode, ...]:
    """Group summaries, checks and divergences by tier once, in report order; mark each root and its consequences."""
    Key = tuple[str, str, str]
    by_tap: dict[tuple[str, str, str, str], list[CheckResult]] = {}
    for r in checks:
        by_tap.setdefault((r.backend, r.precision, r.golden, r.tap), []).append(r)
    by_tier: dict[Key, list[TapSummary]] = {}
    for s in summaries:
        by_tier.setdefault((s.backend, s.precision, s.golden), []).append(s)
    roots: dict[Key, FirstDivergence] = {(d.backend, d.precision, d.golden): d for d in divergences}
    tiers = []
    for (backend, precision, golden), group in by_tier.items():
        root = roots.get((backend, precision, golden))
        taps = []
        for s in group:
            at_root = root is not None and s.tap == root.tap
            downstream = root is not None and not at_root and s.status == FAIL
            taps.append(TapNode(s, tuple(by_tap.get((backend, precision, golden, s.tap), ())),
                                root=root if at_root else None, after=root.tap if downstream and root else None))
        tiers.append(TierNode(backend, precision, golden, tuple(taps), root, seconds.get((backend, precision), 0.0)))
    return tuple(tiers)


def _decoding(dec: DecodingReport) -> DecodingNode:
    seconds = {(r.backend, r.precision): r.seconds for r in dec.runs}
    greedy: dict[tuple[str, str], list[GreedyCheck]] = {}
    for g in dec.greedy:
        greedy.setdefault((g.backend, g.precision), []).append(g)
    return DecodingNode(dec, _tiers(dec.summaries, dec.checks, dec.divergences, seconds),
                        tuple(GreedyNode(b, p, tuple(rows)) for (b, p), rows in greedy.items()))


def _grad(grad: GradReport) -> GradNode:
    seconds = {(r.backend, r.precision): r.seconds for r in grad.runs}
    return GradNode(grad, _tiers(grad.summaries, grad.checks, grad.divergences, seconds),
                    _tiers(grad.train_summaries, grad.train_checks, grad.train_divergences, {}))


def build_tree(report: FinishedReport) -> ReportTree:
    """The report's tree (see the module docstring). Called once per Report, by `Report.tree`."""
    seconds = {(r.backend, r.precision): r.seconds for r in report.runs if r.status == RunStatus.RAN}
    return ReportTree(
        fixture=report.fixture,
        verdict=report.verdict,
        tiers=_tiers(report.summaries, report.results, report.divergences, seconds),
        decoding=_decoding(report.decoding) if report.decoding is not None else None,
        runs=tuple(report.runs),
        grad=_grad(report.grad) if report.grad is not None else None,
    )
