"""Judging the backward and the training step: the tolerances, the checks, and the gradient report.

Every check is the forward pass's (`judge_tensor`, one `CheckResult`), folded by the one `fold`:

- **The backward**, per training case: the loss and every gradient (parity_reference/training.py), in backward
  order: `loss` first, then the tap gradients from `logits.grad` back to the embedding, then the parameters'. So
  the first divergence is the gradient nearest the loss, and every gradient before it in that order agrees.
- **The training step**, case `train`, step s = 1..N: the loss, the gradient norm, then every parameter after
  the update, ordered by step first: a one-step schedule error shows at its step.

**Tolerances** (docs/tolerances.md, "Gradients"): atol = c_name * eps * M, rtol 0, where eps is the golden tier's
and M is the largest float64-golden magnitude up to that name in backward order, over the cases (the forward's
rule, read in the backward's order: round-off is carried from the loss towards the embedding); the loss's M
is its own. c_name is the
tier's c (`Fixture.training_section().c`), raised to BUDGET_FACTOR times the name's measured units where the
fixture records them (`units`: the reference's own float32 backward against its float64 one, in eps32 * M, for
an ill-conditioned fixture such as toy-stress); one measured number serves both tiers, the error being a
property of the computation's conditioning. A training record's M is its own magnitude (the loss, the norm, the
parameter's largest value at that step).

**AdamW's unresolved elements.** Where a parameter's gradient at a step is zero within the tier's gradient
tolerance in the float64 golden (the key bias: softmax ignores a constant per query row), its sign is
rounding noise, and AdamW turns noise into a step of up to lr: the update is unresolved in that tier. Those
elements are judged by AdamW's own bound instead: |diff| <= 2 * sum over steps t <= s of lr_t * B_t
(`parity_reference.training.adam_bound`), plus the element's ordinary atol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from parity_harness._compare.judge import (
    FAIL,
    NOT_SUPPORTED,
    CheckResult,
    FirstDivergence,
    TapSummary,
    fold,
    judge_tensor,
)
from parity_harness._core.precision import EPS, Precision
from parity_harness._fixture.training_section import BUDGET_FACTOR
from parity_reference.training import GRAD_SUFFIX, TrainingSpec, adam_bound, step_key

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture
    from parity_harness._fixture.training import GradOutput, TrainOutput

LOSS, GRAD_NORM, TRAIN_CASE = "loss", "grad_norm", "train"


@dataclass(frozen=True)
class GradTolerances:
    """Every tolerance of one fixture's backward and training checks, per golden tier."""

    c: Mapping[str, float]  # per tier
    units: Mapping[str, float]  # measured units by name ("{name}.grad", "loss", or "step{s}/{name}")
    magnitude: Mapping[str, float]  # M by name: the backward's running maximum, a training record's own
    lr_bound: Mapping[int, float]  # step -> 2 * sum_{t <= s} lr_t * B_t: AdamW's bound on an unresolved element

    def c_of(self, tier: str, name: str) -> float:
        return max(self.c[tier], BUDGET_FACTOR * self.units.get(name, 0.0))

    def atol(self, tier: str, name: str) -> float:
        return self.c_of(tier, name) * EPS[tier] * self.magnitude[name]  # type: ignore[index]


def backward_order(fixture: Fixture) -> list[str]:
    """The backward's check order: the case's loss, then every gradient (`Fixture.grad_names`)."""
    return [LOSS, *fixture.grad_names()]


def train_order(fixture: Fixture) -> list[str]:
    """A training step's check order: its loss, its gradient norm, then every parameter after the update."""
    return [LOSS, GRAD_NORM, *fixture.model.param_shapes()]


def _largest(arrays: Sequence[np.ndarray]) -> float:
    return max((float(np.max(np.abs(a))) if a.size else 0.0 for a in arrays), default=0.0)


def grad_tolerances(fixture: Fixture, golden64: GradOutput, train64: TrainOutput) -> GradTolerances:
    """The tolerances from the float64 goldens and the manifest's training section."""
    section = fixture.training_section()
    assert section is not None
    spec = section.spec
    magnitude: dict[str, float] = {}
    running = 0.0
    for name in backward_order(fixture):
        own = _largest([golden64[case][name] for case in spec.cases])
        if name == LOSS:  # its own size: a loss of 12 says nothing about its gradients' round-off
            magnitude[name] = own
            continue
        running = max(running, own)
        magnitude[name] = running
    for s in range(1, spec.steps + 1):
        for name in train_order(fixture):
            magnitude[step_key(s, name)] = _largest([train64[step_key(s, name)]])
    bound: dict[int, float] = {}
    total = 0.0
    for s in range(1, spec.steps + 1):
        total += spec.lr[s - 1] * adam_bound(spec, s)
        bound[s] = 2.0 * total
    return GradTolerances(dict(section.c), dict(section.units), magnitude, bound)


def measure_units(fixture: Fixture) -> dict[str, float]:
    """The reference's float32 backward and training against its float64 ones, in eps32 * M of each name, where
    BUDGET_FACTOR times it exceeds the fp32 c (the rest is within c): what `parity export` records as the
    training section's `units`. A parameter after a step is measured on its resolved elements only."""
    from parity_harness._fixture.training import golden_training

    spec = fixture.training()
    assert spec is not None
    (g32, t32), (g64, t64) = golden_training(fixture, "fp32"), golden_training(fixture, "fp64")
    tol = grad_tolerances(fixture, g64, t64)
    eps = EPS["fp32"]
    units: dict[str, float] = {}

    def err(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.max(np.abs(a.astype(np.float64) - b))) if b.size else 0.0

    for name in backward_order(fixture):
        worst = max(err(g32[case][name], g64[case][name]) for case in spec.cases)
        units[name] = worst / (eps * tol.magnitude[name]) if tol.magnitude[name] > 0 else 0.0
    tol = GradTolerances(tol.c, {k: v for k, v in units.items()}, tol.magnitude, tol.lr_bound)
    params = set(fixture.model.param_shapes())
    for s in range(1, spec.steps + 1):
        for name in train_order(fixture):
            key = step_key(s, name)
            a, b = t32[key], t64[key]
            if name in params:
                keep = ~unresolved(fixture, tol, "fp32", t64, s, name)
                a, b = a[keep], b[keep]
            units[key] = err(a, b) / (eps * tol.magnitude[key]) if tol.magnitude[key] > 0 else 0.0
    floor = tol.c["fp32"] / BUDGET_FACTOR
    return {k: float(f"{u:.3g}") for k, u in units.items() if u > floor}


def unresolved(fixture: Fixture, tol: GradTolerances, tier: str, train64: TrainOutput, step: int,
               param: str) -> np.ndarray:
    """The elements of `param` whose float64 batch gradient, at some step up to `step`, is zero within the tier's
    tolerance of that parameter's gradient: their AdamW updates are rounding noise in that tier."""
    atol = tol.atol(tier, param + GRAD_SUFFIX)
    mask = np.zeros(fixture.model.param_shapes()[param], dtype=bool)
    for t in range(1, step + 1):
        mask |= np.abs(train64[step_key(t, param + GRAD_SUFFIX)]) <= atol
    return mask


def judge_backward(fixture: Fixture, backend: str, precision: Precision, tier: Precision, output: GradOutput,
                   golden: GradOutput, supported: Sequence[str], tol: GradTolerances) -> list[CheckResult]:
    """Every training case's loss and gradients of one backend x precision against one tier, in backward order."""
    spec = fixture.training()
    assert spec is not None
    declared = {LOSS, *supported}
    results: list[CheckResult] = []
    for case in spec.cases:
        got = output.get(case, {})
        for name in backward_order(fixture):
            atol = tol.atol(tier, name)
            if name not in declared:
                results.append(CheckResult(backend, precision, tier, case, name, NOT_SUPPORTED, None, atol, 0.0))
                continue
            results.append(judge_tensor(backend, precision, tier, case, name, got.get(name), golden[case][name],
                                        atol, 0.0))
    return results


def judge_training(fixture: Fixture, backend: str, precision: Precision, tier: Precision, output: TrainOutput,
                   golden: TrainOutput, train64: TrainOutput, tol: GradTolerances) -> list[CheckResult]:
    """Every training step's records of one backend x precision against one tier, step by step."""
    spec = fixture.training()
    assert spec is not None
    params = set(fixture.model.param_shapes())
    results: list[CheckResult] = []
    for s in range(1, spec.steps + 1):
        for name in train_order(fixture):
            key = step_key(s, name)
            atol = tol.atol(tier, key)
            actual, expected = output.get(key), golden[key]
            if name not in params or actual is None:
                results.append(judge_tensor(backend, precision, tier, TRAIN_CASE, name, actual, expected, atol, 0.0,
                                            step=s))
                continue
            results.append(_judge_param(fixture, backend, precision, tier, s, name, actual, expected, train64, tol))
    return results


def _judge_param(fixture: Fixture, backend: str, precision: Precision, tier: Precision, step: int, name: str,
                 actual: np.ndarray, expected: np.ndarray, train64: TrainOutput, tol: GradTolerances) -> CheckResult:
    """A parameter after step `step`: its resolved elements at the ordinary atol, the unresolved by AdamW's bound."""
    key = step_key(step, name)
    atol = tol.atol(tier, key)
    mask = unresolved(fixture, tol, tier, train64, step, name)
    if not mask.any() or not isinstance(actual, np.ndarray) or actual.shape != expected.shape:
        return judge_tensor(backend, precision, tier, TRAIN_CASE, name, actual, expected, atol, 0.0, step=step)
    resolved = np.array(actual, copy=True)
    resolved[mask] = expected[mask]  # judged apart, below
    result = judge_tensor(backend, precision, tier, TRAIN_CASE, name, resolved, expected, atol, 0.0, step=step)
    if result.status == FAIL:
        return result
    diff = np.abs(actual[mask].astype(np.float64) - expected[mask].astype(np.float64))
    allowed = atol + tol.lr_bound[step]
    worst = float(np.max(diff)) if not np.isnan(diff).any() else math.inf
    if worst <= allowed:
        return result
    bad = int(np.count_nonzero(~(diff <= allowed)))
    index = [int(i) for i in np.unravel_index(int(np.flatnonzero(mask)[int(np.nanargmax(np.where(
        np.isnan(diff), np.inf, diff)))]), expected.shape)]
    return CheckResult(backend, precision, tier, TRAIN_CASE, name, FAIL, False, atol, 0.0, worst, None, worst,
                       index, float(actual[tuple(index)]), float(expected[tuple(index)]),
                       f"{bad} element(s) whose gradient is zero in the float64 golden moved {worst:.3g}, beyond "
                       f"AdamW's bound {allowed:.3g} (2 x the sum of lr x B over steps 1..{step})", bad, step,
                       int(expected.size))


@dataclass
class GradRun:
    backend: str
    precision: str
    seconds: float


@dataclass
class GradReport:
    """The backward and training checks of a run (`parity run --grad`)."""

    available: bool  # the fixture has gradient goldens
    cases: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # the backward's check order (`backward_order`)
    steps: int = 0
    train_names: list[str] = field(default_factory=list)  # a step's check order (`train_order`)
    checks: list[CheckResult] = field(default_factory=list)
    summaries: list[TapSummary] = field(default_factory=list)
    divergences: list[FirstDivergence] = field(default_factory=list)
    train_checks: list[CheckResult] = field(default_factory=list)  # case "train", `step` set
    train_summaries: list[TapSummary] = field(default_factory=list)
    train_divergences: list[FirstDivergence] = field(default_factory=list)
    runs: list[GradRun] = field(default_factory=list)
    not_supported: list[str] = field(default_factory=list)  # backends without a backward
    not_training: list[str] = field(default_factory=list)  # backends with a backward but no training step
    spec: TrainingSpec | None = None
    c: dict[str, float] = field(default_factory=dict)  # the tolerance's c per tier
    n_budgeted: int = 0  # names whose c is raised by a measured budget (the manifest's `units`)

    def fold(self) -> None:
        self.summaries, self.divergences = fold(self.checks, self.names)
        self.train_summaries, self.train_divergences = fold(self.train_checks, self.train_names)

    @property
    def param_names(self) -> set[str]:
        return set(self.train_names[2:])

    @property
    def n_failed(self) -> int:
        return sum(1 for r in (*self.checks, *self.train_checks) if r.passed is False)

    @property
    def n_passed(self) -> int:
        return sum(1 for r in (*self.checks, *self.train_checks) if r.passed is True)


__all__ = ["GRAD_NORM", "LOSS", "TRAIN_CASE", "GradReport", "GradRun", "GradTolerances", "backward_order",
           "grad_tolerances", "judge_backward", "judge_training", "measure_units", "train_order", "unresolved"]
