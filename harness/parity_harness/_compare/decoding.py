"""The judged records of decoding: greedy-token checks, decoding runs, the decoding report, and the judge.

Each step of a backend's incremental decoding is judged as the forward taps are, one `CheckResult` (with
`step` set and the prompt as its case) made by `parity_harness._compare.judge.judge_tensor`; the greedy
tokens, a comparison of token ids, are a record of their own (`GreedyCheck`). Running the backends is
`parity_harness._run.decode_check`'s job; these records are what the report and the views hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from parity_harness._compare.judge import CheckResult, FirstDivergence, TapSummary, judge_tensor
from parity_harness._core.precision import Precision
from parity_harness._core.status import GreedyStatus
from parity_harness._fixture.decoding import DecodeOutput, step_key, top2_margin

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


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


__all__ = ["FAIL", "NEAR_TIE", "OK", "DecodeRun", "DecodingReport", "GreedyCheck", "compare_decoding", "greedy_checks",
           "step_name"]
