"""The decoding check of `parity run`: incremental decoding against the full forward, and greedy tokens.

For every backend that supports decoding (`Backend.supports_decoding`), in every precision it
computes in and every tier that precision is judged in (as the forward taps): each step's cache
(keys and values of every block, [H, T, d_head]) and logits against the decoding goldens, made by
the full forward (harness/decoding.py), at the tier's tolerance; then the greedy tokens, the
argmax of each step's logits, against the golden's. Each step is fed the golden's token, so a
step compares like with like even after a backend would have picked another word.

A greedy token that differs where the backend's logits are within tolerance is a near-tie (the
golden's top-2 margin there is within what the tolerance allows): reported, with its margin, but
not a failure. Where the logits are out of tolerance, the logits check fails at that step.

Each step's check is the forward pass's: one `CheckResult` (with `step` set and the prompt as its case)
made by `harness.compare.judge_tensor`, folded by `harness.compare.fold`. Only the greedy tokens, a
comparison of token ids, are a record of their own (`GreedyCheck`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from harness.backends.base import Precision
from harness.backends.boundary import AnyBackend, guarded
from harness.compare import NOT_SUPPORTED, CheckResult, FirstDivergence, TapSummary, fold, judge_tensor
from harness.decoding import DecodeOutput, golden_decoding, step_key, top2_margin
from harness.status import GreedyStatus

if TYPE_CHECKING:
    from harness.fixture import Fixture

OK, FAIL, NEAR_TIE = GreedyStatus.OK, GreedyStatus.FAIL, GreedyStatus.NEAR_TIE


@dataclass
class GreedyCheck:
    """One backend x precision x prompt: its greedy token at every step against the golden's."""

    backend: str
    precision: str
    prompt: str
    expected: list[int]
    actual: list[int]
    status: GreedyStatus
    first_step: int | None = None  # the first step whose token differs
    margin: float | None = None  # the golden's top-2 logit margin there


@dataclass
class DecodeRun:
    backend: str
    precision: str
    seconds: float


@dataclass
class DecodingReport:
    available: bool  # the fixture has decoding goldens
    steps: int = 0
    prompts: list[str] = field(default_factory=list)
    taps: list[str] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)  # `step` set, the prompt in `case`
    summaries: list[TapSummary] = field(default_factory=list)
    divergences: list[FirstDivergence] = field(default_factory=list)  # `step` and `margin` set
    greedy: list[GreedyCheck] = field(default_factory=list)
    runs: list[DecodeRun] = field(default_factory=list)
    not_supported: list[str] = field(default_factory=list)  # backends without decoding
    vocab: list[str] = field(default_factory=list, repr=False)  # for naming words in the report
    sequences: dict[str, list[int]] = field(default_factory=dict, repr=False)  # prompt + greedy tokens, per prompt

    @property
    def n_passed(self) -> int:
        return sum(c.passed is True for c in self.checks)

    @property
    def n_failed(self) -> int:
        return sum(c.passed is False for c in self.checks) + sum(g.status == FAIL for g in self.greedy)

    @property
    def n_near_ties(self) -> int:
        return sum(g.status == NEAR_TIE for g in self.greedy)


Progress = Callable[[str], None]


def run_decoding(
    fixture: Fixture, backends: Sequence[AnyBackend], precisions: list[Precision], progress: Progress | None = None
) -> DecodingReport:
    """Decode with every backend that supports it, in every wanted precision it computes in; compare."""
    from harness.precision import tiers_for

    say = progress or (lambda _msg: None)
    decoding = fixture.decoding()
    if decoding is None:
        return DecodingReport(available=False)
    report = DecodingReport(True, decoding.steps, [p.name for p in decoding.prompts], list(decoding.taps))
    report.vocab = list(fixture.vocab)
    report.sequences = {p.name: [*p.tokens, *p.generated] for p in decoding.prompts}
    goldens = {p: golden_decoding(fixture, p) for p in ("fp32", "fp64")}
    for backend in [guarded(b) for b in backends]:
        if not backend.decodes(fixture):
            report.not_supported.append(backend.name)
            continue
        for precision in precisions:
            if precision not in backend.precisions:
                continue
            say(f"parity: decoding with {backend.name} ({precision}) ...")
            start = time.perf_counter()
            output = backend.decoded(fixture, precision, decoding.requests())
            report.runs.append(DecodeRun(backend.name, precision, time.perf_counter() - start))
            for golden in tiers_for(precision):
                report.checks += compare_decoding(fixture, backend.name, precision, golden, output, goldens[golden])
            report.greedy += greedy_checks(fixture, backend.name, precision, output, goldens["fp64"], report.checks)
    report.summaries, report.divergences = fold(report.checks, report.taps)
    for d in report.divergences:  # how close the golden's greedy choice is to a tie at that step
        d.margin = top2_margin(goldens["fp64"][d.case][step_key(d.step or 0, "logits")])
    return report


def compare_decoding(
    fixture: Fixture, name: str, precision: Precision, golden_tier: Precision, output: DecodeOutput,
    golden: DecodeOutput,
) -> list[CheckResult]:
    """Every prompt x step x tap of one backend's decoding against one golden tier, by the one judge."""
    decoding = fixture.decoding()
    assert decoding is not None
    tolerances = fixture.tolerances[golden_tier]
    checks: list[CheckResult] = []
    for prompt in decoding.prompts:
        for k in range(decoding.steps + 1):
            for tap in decoding.taps:
                tol = tolerances.for_tap(tap)
                key = step_key(k, tap)
                checks.append(judge_tensor(name, precision, golden_tier, prompt.name, tap, output[prompt.name].get(key),
                                           golden[prompt.name][key], tol.atol, tol.rtol, step=k))
    return checks


def greedy_checks(
    fixture: Fixture, name: str, precision: Precision, output: DecodeOutput, golden64: DecodeOutput,
    checks: list[CheckResult],
) -> list[GreedyCheck]:
    """The backend's argmax at every step against the golden's; a differing token is a near-tie when its logits pass."""
    decoding = fixture.decoding()
    assert decoding is not None
    rows: list[GreedyCheck] = []
    for prompt in decoding.prompts:
        actual: list[int] = []
        for k in range(decoding.steps + 1):
            logits = output[prompt.name].get(step_key(k, "logits"))
            actual.append(int(np.argmax(logits)) if logits is not None and np.size(logits) else -1)
        expected = list(prompt.generated)
        row = GreedyCheck(name, precision, prompt.name, expected, actual, OK)
        if actual != expected:
            k = next(i for i, (a, b) in enumerate(zip(actual, expected, strict=True)) if a != b)
            row.first_step = k
            row.margin = top2_margin(golden64[prompt.name][step_key(k, "logits")])
            logits_ok = all(c.passed for c in checks if (c.backend, c.precision, c.case, c.step, c.tap)
                            == (name, precision, prompt.name, k, "logits"))
            row.status = NEAR_TIE if logits_ok else FAIL
        rows.append(row)
    return rows


def step_name(step: int) -> str:
    return "step 0 (prefill)" if step == 0 else f"step {step}"


__all__ = ["NOT_SUPPORTED", "DecodingReport", "run_decoding"]
