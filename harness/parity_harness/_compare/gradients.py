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

**The training step's tolerances are the gradients' carried through AdamW.** AdamW maps each element's gradients
to its update on its own, and nearly divides the gradient by its own size: where a gradient is small (the key
bias's is zero: softmax ignores a constant per query row), an error within the gradient's tolerance can move
the update by up to lr. So a parameter after step s is allowed c * eps * M plus, element by element, how far
AdamW moves it when every step's float64 golden gradient is shifted by its tolerance (the parameter's gradient
atol in that tier), up and down: `allowance`. A step's loss is allowed the first-order change that moves the
parameters make (sum of |golden gradient| x the previous step's allowance); its gradient norm the norm of every
gradient at its tolerance, sqrt(sum over parameters of size x atol^2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from parity_harness._compare.judge import (
    FAIL,
    NOT_SUPPORTED,
    OK,
    CheckResult,
    FirstDivergence,
    TapSummary,
    fold,
    judge_tensor,
)
from parity_harness._core.precision import EPS, Precision
from parity_harness._fixture.training_section import BUDGET_FACTOR
from parity_reference.training import GRAD_SUFFIX, TrainingSpec, step_key

if TYPE_CHECKING:
    from parity_harness._fixture.files import TensorFile
    from parity_harness._fixture.fixture import Fixture
    from parity_harness._fixture.training import GradOutput, TrainOutput

LOSS, GRAD_NORM, TRAIN_CASE = "loss", "grad_norm", "train"


@dataclass(frozen=True)
class GradTolerances:
    """Every tolerance of one fixture's backward and training checks, per golden tier."""

    c: Mapping[str, float]  # per tier
    units: Mapping[str, float]  # measured units by gradient name ("loss", "{name}.grad")
    magnitude: Mapping[str, float]  # M by name: the backward's running maximum, a training record's own
    # (tier, "step{s}/{name}") -> what the gradients' tolerances carry into it through AdamW: an array for a parameter
    # (per element), a number for the loss and the gradient norm
    allowance: Mapping[tuple[str, str], np.ndarray | float] = field(default_factory=dict)

    def c_of(self, tier: str, name: str) -> float:
        return max(self.c[tier], BUDGET_FACTOR * self.units.get(name, 0.0))

    def atol(self, tier: str, name: str) -> float:
        return self.c_of(tier, name) * EPS[tier] * self.magnitude[name]  # type: ignore[index]

    def allowances(self, tiers: Sequence[str], step: int, name: str) -> list[np.ndarray | float]:
        """`allowance[(tier, step_key(step, name))]` for each of `tiers` (0 where it has none): a parameter's every
        tier at once where the allowances are computed when looked up (one pass of AdamW over its elements)."""
        if isinstance(self.allowance, _Allowances):
            return self.allowance.of_tiers(tiers, step, name)
        return [self.allowance.get((tier, step_key(step, name)), 0.0) for tier in tiers]


def backward_order(fixture: Fixture) -> list[str]:
    """The backward's check order: the case's loss, then every gradient (`Fixture.grad_names`)."""
    return [LOSS, *fixture.grad_names()]


def train_order(fixture: Fixture) -> list[str]:
    """A training step's check order: its loss, its gradient norm, then every parameter after the update."""
    return [LOSS, GRAD_NORM, *fixture.model.param_shapes()]


def _largest(arrays: Sequence[np.ndarray]) -> float:
    return max((float(np.max(np.abs(a))) if a.size else 0.0 for a in arrays), default=0.0)


def adamw_trajectory(p0: np.ndarray, grads: Sequence[np.ndarray], spec: TrainingSpec, decays: bool) -> list[np.ndarray]:
    """The parameter after each step of `spec`'s AdamW from `p0` fed `grads`, in float64: torch's arithmetic.
    A gradient may have leading axes beyond p0's (several trajectories at once, p0 broadcast against them)."""
    b1, b2 = spec.betas
    p, m, v = p0.astype(np.float64), np.zeros(p0.shape), np.zeros(p0.shape)
    out: list[np.ndarray] = []
    for t, g in enumerate(grads, 1):
        lr = spec.lr[t - 1]
        if decays:
            p = p * (1.0 - lr * spec.weight_decay)
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g * g
        denom = np.sqrt(v) / math.sqrt(1.0 - b2**t) + spec.eps
        p = p - (lr / (1.0 - b1**t)) * m / denom
        out.append(p)
    return out


CHUNK = 1 << 15  # elements per slice of a parameter's allowance: AdamW's arithmetic in the CPU's cache


def _each_slice(size: int, work: Callable[[slice], None]) -> None:
    """`work(part)` for every CHUNK-sized slice of range(size), writing only its own slice of its outputs."""
    for at in range(0, size, CHUNK):
        work(slice(at, at + CHUNK))


class _Allowances(Mapping[tuple[str, str], "np.ndarray | float"]):
    """(tier, "step{s}/{name}") -> what the gradients' tolerances carry into that training record through AdamW,
    computed when looked up: a parameter's from its own weights and batch gradients (read one tensor at a time),
    every step at once (its base, up and down trajectories in one pass of AdamW over a stacked array). Kept when
    every tier's and step's fit in KEEP elements, so a small fixture's steps and its losses' look-ups reuse them; a
    GPT-2-sized fixture's (124 M per tier and step) are never kept, so they never sit in memory for the run."""

    KEEP = 1 << 24  # float64 elements: a fixture's allowances are kept if all of them fit (128 MB)

    TIERS = ("fp32", "fp64")

    def __init__(self, fixture: Fixture, spec: TrainingSpec, train64: TrainOutput,
                 atol: Callable[[str, str], float]) -> None:
        self._fixture, self._spec, self._train64, self._atol = fixture, spec, train64, atol
        self._params = fixture.model.param_shapes()
        self._keys = [(tier, step_key(s, name)) for tier in self.TIERS for s in range(1, spec.steps + 1)
                      for name in (LOSS, GRAD_NORM, *self._params)]
        self._known = set(self._keys)
        self._kept: dict[tuple[str, str], list[np.ndarray]] = {}
        self._weights: TensorFile | None = None
        self._keep = len(self.TIERS) * spec.steps * sum(math.prod(s) for s in self._params.values()) <= self.KEEP

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, key: tuple[str, str]) -> np.ndarray | float:
        if key not in self._known:
            raise KeyError(key)
        tier, record = key
        step, name = int(record.split("/", 1)[0].removeprefix("step")), record.split("/", 1)[1]
        if name == GRAD_NORM:
            return math.sqrt(sum(math.prod(shape) * self._atol(tier, n + GRAD_SUFFIX) ** 2
                                 for n, shape in self._params.items()))
        if name == LOSS:  # first order: the batch loss's change as the parameters move
            return 0.0 if step == 1 else sum(
                float(np.sum(np.abs(self._train64[step_key(step, n + GRAD_SUFFIX)]) * self[(tier, step_key(step - 1,
                                                                                                            n))]))
                for n in self._params)
        return self.of_tiers((tier,), step, name)[0]

    def of_tiers(self, tiers: Sequence[str], step: int, name: str) -> list[np.ndarray | float]:
        """Each of `tiers`' allowance of parameter `name` after `step` (the loss and the norm: `__getitem__`'s); the
        tiers not kept computed together, in one pass of AdamW."""
        if name in (LOSS, GRAD_NORM):
            return [self[(tier, step_key(step, name))] for tier in tiers]
        missing = [t for t in tiers if (t, name) not in self._kept]
        fresh = dict(zip(missing, self._param(missing, name), strict=True)) if missing else {}
        if self._keep:
            self._kept.update({(t, name): a for t, a in fresh.items()})
        return [(fresh[t] if t in fresh else self._kept[(t, name)])[step - 1] for t in tiers]

    def _param(self, tiers: Sequence[str], name: str) -> list[list[np.ndarray]]:
        """Per tier, the parameter's allowance after each step: its base trajectory and, per tier, the up and down
        ones (every step's golden gradient shifted by the tier's atol) in one pass of AdamW over a stacked array."""
        from parity_harness._fixture.files import open_checked, read_checked
        from parity_reference.tensor_check import WEIGHTS, Expected

        if self._weights is None:  # the header checked once, each parameter read when its allowances are computed
            self._weights = open_checked(self._fixture.weights_path, {n: Expected(("float32",), tuple(s))
                                                                      for n, s in self._params.items()}, WEIGHTS)
        p0 = dict(read_checked(self._weights, [name], WEIGHTS))[name]
        spec, steps = self._spec, range(1, self._spec.steps + 1)
        grads = [np.asarray(self._train64[step_key(s, name + GRAD_SUFFIX)]).reshape(-1) for s in steps]
        deltas, decays = [self._atol(tier, name + GRAD_SUFFIX) for tier in tiers], spec.decays(name)
        flat = p0.reshape(-1)
        out = [[np.empty(flat.shape, dtype=np.float64) for _ in steps] for _ in tiers]

        def chunk(part: slice) -> None:  # element by element, so in cache-sized chunks: the same numbers
            g = [x[part].astype(np.float64, copy=False) for x in grads]
            # base, then each tier's up and down, in one pass: each element's arithmetic is its own (the same numbers)
            stacked = [np.stack((x, *(y for d in deltas for y in (x + d, x - d)))) for x in g]  # (1 + 2 tiers, chunk)
            for s, t in enumerate(adamw_trajectory(flat[part], stacked, spec, decays)):  # t: (1 + 2 tiers, chunk)
                for i, o in enumerate(out):
                    o[s][part] = np.maximum(np.abs(t[1 + 2 * i] - t[0]), np.abs(t[2 + 2 * i] - t[0]))

        _each_slice(flat.size, chunk)
        return [[a.reshape(p0.shape) for a in o] for o in out]


def _allowances(fixture: Fixture, spec: TrainingSpec, train64: TrainOutput,
                atol: Callable[[str, str], float]) -> Mapping[tuple[str, str], np.ndarray | float]:
    return _Allowances(fixture, spec, train64, atol)


def backward_magnitudes(fixture: Fixture, golden64: GradOutput) -> dict[str, float]:
    """M of each name of the backward: the largest float64 golden value up to it in backward order over the training
    cases; the loss's its own."""
    spec = fixture.training()
    assert spec is not None
    magnitude: dict[str, float] = {}
    running = 0.0
    for name in backward_order(fixture):
        own = _largest([golden64[case][name] for case in spec.cases])
        if name == LOSS:  # its own size: a loss of 12 says nothing about its gradients' round-off
            magnitude[name] = own
            continue
        running = max(running, own)
        magnitude[name] = running
    return magnitude


def grad_tolerances(fixture: Fixture, golden64: GradOutput, train64: TrainOutput) -> GradTolerances:
    """The tolerances from the float64 goldens and the manifest's training section."""
    section = fixture.training_section()
    assert section is not None
    spec = section.spec
    magnitude = backward_magnitudes(fixture, golden64)
    for s in range(1, spec.steps + 1):
        for name in train_order(fixture):
            magnitude[step_key(s, name)] = _largest([train64[step_key(s, name)]])
    tol = GradTolerances(dict(section.c), dict(section.units), magnitude)
    return GradTolerances(tol.c, tol.units, magnitude, _allowances(fixture, spec, train64, tol.atol))


def measure_units(fixture: Fixture) -> dict[str, float]:
    """The reference's float32 backward against its float64 one, in eps32 * M of each gradient, where
    BUDGET_FACTOR times it exceeds the fp32 c (the rest is within c): what `parity export` records as the
    training section's `units` (an ill-conditioned fixture's; the toy's are all within c)."""
    from parity_harness._fixture.training import golden_training

    spec = fixture.training()
    assert spec is not None
    g32, g64 = golden_training(fixture, "fp32")[0], golden_training(fixture, "fp64")[0]
    section = fixture.training_section()
    assert section is not None
    magnitude, units = backward_magnitudes(fixture, g64), {}
    for name in backward_order(fixture):
        worst = max(float(np.max(np.abs(g32[case][name].astype(np.float64) - g64[case][name])))
                    if g64[case][name].size else 0.0 for case in spec.cases)
        scale = EPS["fp32"] * magnitude[name]
        units[name] = worst / scale if scale > 0 else 0.0
    floor = section.c["fp32"] / BUDGET_FACTOR
    return {k: float(f"{u:.3g}") for k, u in units.items() if u > floor}


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
                   golden: TrainOutput, tol: GradTolerances) -> list[CheckResult]:
    """Every training step's records of one backend x precision against one tier, step by step: each at
    c * eps * M plus what the gradients' tolerances carry into it through AdamW (`GradTolerances.allowance`)."""
    return judge_training_tiers(fixture, backend, precision, {tier: golden}, output, tol)


def judge_training_tiers(fixture: Fixture, backend: str, precision: Precision, goldens: Mapping[Precision, TrainOutput],
                         output: TrainOutput, tol: GradTolerances) -> list[CheckResult]:
    """`judge_training` against each tier of `goldens` in turn, the results tier by tier (as one call per tier
    gives them): each record is judged in every tier before the next, so a parameter's allowances of every tier
    are computed in one pass (`GradTolerances.allowances`)."""
    spec = fixture.training()
    assert spec is not None
    tiers = list(goldens)
    results: dict[Precision, list[CheckResult]] = {tier: [] for tier in tiers}
    for s in range(1, spec.steps + 1):
        for name in train_order(fixture):
            key = step_key(s, name)
            actual, allowed = output.get(key), tol.allowances(tiers, s, name)
            for tier, allowance in zip(tiers, allowed, strict=True):
                results[tier].append(_judge_record(backend, precision, tier, s, name, actual, goldens[tier][key],
                                                   tol.atol(tier, key), allowance))
            del allowed  # a GPT-2-sized parameter's allowances: not held past its record
    return [r for tier in tiers for r in results[tier]]


def _judge_record(backend: str, precision: Precision, tier: Precision, step: int, name: str,
                  actual: np.ndarray | None, expected: np.ndarray, atol: float,
                  allowance: np.ndarray | float) -> CheckResult:
    """One record: each element within atol + its allowance. The result's atol is c * eps * M; its error is what
    exceeds the allowance (so the share of tolerance used is the share of atol beyond what AdamW carries)."""
    fast = _beyond(actual, expected, atol, allowance, precision, tier)
    if fast is not None:  # a well-formed, finite result: what the whole-array arithmetic below gives, by slices
        max_diff, worst, used, n_bad = fast
        index = [int(i) for i in np.unravel_index(worst, expected.shape)] if expected.ndim else []
        got, want = float(actual.flat[worst]), float(expected.flat[worst])  # type: ignore[union-attr]
        carried = float(allowance.flat[worst]) if isinstance(allowance, np.ndarray) else float(allowance)
        message = "" if not n_bad else (f"|diff| {abs(got - want):.3g} exceeds what AdamW carries from the gradients' "
                                        f"tolerance there ({carried:.3g}) by more than atol {atol:.3g}")
        return CheckResult(backend, precision, tier, TRAIN_CASE, name, FAIL if n_bad else OK, not n_bad, atol, 0.0,
                           max_diff, None, used, index or None, got, want, message, n_bad, step, int(expected.size))
    widest = float(np.max(allowance)) if np.size(allowance) else 0.0
    loose = judge_tensor(backend, precision, tier, TRAIN_CASE, name, actual, expected, atol + widest, 0.0, step=step)
    if actual is None or loose.message or not isinstance(actual, np.ndarray) or actual.shape != expected.shape:
        return loose  # missing, structural (shape, dtype, NaN, infinity): as the forward pass says it
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    beyond = np.maximum(diff - allowance, 0.0)
    bad = beyond > atol
    worst = int(np.argmax(beyond)) if beyond.size else 0
    index = [int(i) for i in np.unravel_index(worst, expected.shape)] if expected.ndim else []
    used = float(beyond.flat[worst]) if beyond.size else 0.0
    n_bad = int(np.count_nonzero(bad))
    a, e = (float(actual.flat[worst]), float(expected.flat[worst])) if expected.size else (None, None)
    carried = float(np.broadcast_to(allowance, diff.shape).flat[worst]) if diff.size else 0.0
    message = "" if not n_bad else (f"|diff| {float(diff.flat[worst]):.3g} exceeds what AdamW carries from the "
                                    f"gradients' tolerance there ({carried:.3g}) by more than atol {atol:.3g}")
    return CheckResult(backend, precision, tier, TRAIN_CASE, name, FAIL if n_bad else OK, not n_bad, atol, 0.0,
                       float(np.max(diff)) if diff.size else 0.0, None, used, index or None, a, e, message, n_bad,
                       step, int(expected.size))


def _beyond(actual: object, expected: np.ndarray, atol: float, allowance: np.ndarray | float, precision: Precision,
            tier: Precision) -> tuple[float, int, float, int] | None:
    """`_judge_record`'s numbers (max |diff|, the worst flat cell, what exceeds the allowance there, the cells beyond
    atol) a slice at a time, without the whole-array copies, when the check can only come down to them: a non-empty
    array of the golden's shape and the dtype `judge_tensor` wants (so no message of its), its differences and what
    exceeds the allowances finite (so no NaN or infinity rule), and not on a coarser grid. None otherwise: the
    whole-array path decides. Each slice's arithmetic is the whole array's, cell for cell; the first largest
    excess of the first slice holding the largest is the whole array's first."""
    from parity_harness._compare.judge import COARSER_GRIDS, coarser_grid_message

    want = expected.dtype if tier == precision else np.dtype(np.float64)
    if (precision not in ("fp32", "fp64") or not isinstance(actual, np.ndarray) or actual.shape != expected.shape
            or actual.dtype != want or expected.dtype not in (np.float32, np.float64) or actual.size == 0
            or (isinstance(allowance, np.ndarray) and allowance.shape != expected.shape)):
        return None
    a, e = actual.reshape(-1), expected.reshape(-1)
    carry = allowance.reshape(-1) if isinstance(allowance, np.ndarray) else None
    largest, worst, used, n_bad = -math.inf, 0, -math.inf, 0
    diff = np.empty(min(a.size, CHUNK))
    for at in range(0, a.size, CHUNK):
        part = slice(at, at + CHUNK)
        d = diff[:a[part].size]
        np.subtract(a[part], e[part], out=d, dtype=np.float64)  # as both upcast to float64, then subtracted
        np.abs(d, out=d)
        top = float(d.max())
        if not math.isfinite(top):
            return None
        largest = max(largest, top)
        np.subtract(d, carry[part] if carry is not None else allowance, out=d)
        np.maximum(d, 0.0, out=d)
        j = int(np.argmax(d))
        if not math.isfinite(float(d[j])):
            return None
        if d[j] > used:
            worst, used = at + j, float(d[j])
        if d[j] > atol:
            n_bad += int(np.count_nonzero(d > atol))
    if precision in COARSER_GRIDS and actual.dtype == np.float32 and coarser_grid_message(actual, expected,
                                                                                          precision) is not None:
        return None
    return largest, worst, used, n_bad


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


__all__ = ["GRAD_NORM", "LOSS", "TRAIN_CASE", "GradReport", "GradRun", "GradTolerances", "adamw_trajectory",
           "backward_magnitudes", "backward_order", "grad_tolerances", "judge_backward", "judge_training",
           "judge_training_tiers", "measure_units", "train_order"]
