"""The known bugs of a backward and of a training step, each predicted from the goldens' numbers: the likely cause
of a gradient check's first divergence (docs/diagnosis.md's rule, read in the backward's order).

Like the forward's known porting bugs (gpt2_causes.py), each pattern computes what the backend would have returned
had it made that bug, from the golden's own values (the gradients upstream of the first divergence, which agree, and
the forward goldens), and names the bug when that prediction explains the candidate (`patterns.explains`: every cell
within the tier's tolerance of the prediction, and each failing cell far nearer the prediction than the golden):

- at a residual stream's gradient that feeds a LayerNorm: LayerNorm's backward without the mean term, the golden's
  + mean(dn) / s (dn the golden's gradient of the LayerNorm's normalized tap, s its scale), or without the variance
  term, the golden's + n mean(dn n) / s;
- at `attn.hook_attn_scores.grad`: softmax's backward from its input, s (dp - sum_j dp_j s_j) with the scores s
  (-inf at masked cells: inf and NaN where the golden's output form gives 0) for the pattern p;
- at `mlp.hook_pre.grad`: the GELU derivative of the other GELU (the tanh approximation's for the exact GELU, or the
  reverse on a gelu_new fixture), times the golden's gradient of `hook_post`;
- at `attn.hook_q.grad` / `hook_k.grad`: the attention scale missing in the backward (sqrt(d_head) x the golden's)
  or applied twice (1/sqrt(d_head) x);
- at `wte.weight.grad`: the tied embedding's gradient from one use, the golden's minus the lookup's share (the rows of
  the golden's `hook_embed.grad` added at the case's tokens), or that share alone;
- at a training step's `grad_norm`: gradients not zeroed between steps, the norm of the sum of the golden's batch
  gradients of steps 1..s;
- at a parameter after step s: AdamW's step replayed from the golden's parameter at step s - 1 and its batch
  gradients of steps 1..s, with the bias correction off by one (t + 1 or t - 1) or missing, or with weight decay
  where the spec excludes it (or none where it decays). Each element is matched within the judge's own tolerance
  there: c * eps * M plus what the gradients' tolerances carry into it through AdamW (`GradTolerances.allowance`:
  where a gradient is near zero, its rounding noise moves the update by up to lr).

`grad_cause` names one divergence; `keep_candidates` keeps, while a backend's outputs are at hand, only the arrays
a first divergence can be at (the earliest failing name of each tier), and `name_causes` sets every first
divergence's `cause` once the report is folded (parity_harness/_run/grad_check.py calls both).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from parity_harness._compare.gradients import GradReport, GradTolerances
from parity_harness._compare.judge import FAIL, CheckResult, FirstDivergence
from parity_harness._compare.patterns import close, explains
from parity_reference.training import GRAD_SUFFIX, step_key

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture
    from parity_harness._fixture.training import GradOutput, TrainOutput

LN_NO_MEAN = "LayerNorm backward without the mean term"
LN_NO_VARIANCE = "LayerNorm backward without the variance term"
SOFTMAX_FROM_INPUT = "softmax backward from its input"
GELU_TANH_DERIVATIVE = "GELU derivative of the tanh approximation"
GELU_EXACT_DERIVATIVE = "GELU derivative of the exact GELU"
SCALE_MISSING = "attention scale missing in the backward"
SCALE_TWICE = "attention scale applied twice in the backward"
TIED_ONE_USE = "tied embedding gradient from one use"
NOT_ZEROED = "gradients not zeroed between steps"
BIAS_CORRECTION = "AdamW bias correction off by one"
NO_BIAS_CORRECTION = "AdamW bias correction missing"
DECAY_EXCLUDED = "weight decay on excluded parameters"
DECAY_MISSING = "weight decay missing"

# Candidates kept for the causes: {(backend, precision): {(case, name): array}}, case "train" for a training record
Kept = dict[tuple[str, str], dict[tuple[str, str], np.ndarray]]
_erf = np.frompyfunc(math.erf, 1, 1)


def _f64(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# -- the backward: a case's gradient at its first divergence ---------------------------------------------------------


def _ln_of(tap: str, n_layer: int) -> str | None:
    """The LayerNorm whose input is the residual stream `tap` (its prefix: "blocks.1.ln2", "ln_final")."""
    parts = tap.split(".")
    if tap in ("hook_embed", "hook_pos_embed"):
        return "blocks.0.ln1"
    if len(parts) != 3 or parts[0] != "blocks":
        return None
    i, hook = int(parts[1]), parts[2]
    if hook == "hook_resid_pre":
        return f"blocks.{i}.ln1"
    if hook == "hook_resid_mid":
        return f"blocks.{i}.ln2"
    if hook == "hook_resid_post":
        return "ln_final" if i == n_layer - 1 else f"blocks.{i + 1}.ln1"
    return None


def _gelu_slope(x: np.ndarray, exact: bool) -> np.ndarray:
    """d/dx of the exact GELU x Phi(x), or of the tanh approximation (gelu_new), in float64."""
    if exact:
        cdf = 0.5 * (1.0 + np.asarray(_erf(x / math.sqrt(2.0)), dtype=np.float64))
        return np.asarray(cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    th = np.tanh(c * (x + a * x**3))
    return np.asarray(0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * a * x * x))


def _explains_nonfinite(a: np.ndarray, b: np.ndarray, pred: np.ndarray, bad: np.ndarray, atol: float) -> bool:
    """Like `explains`, where the prediction itself overflows: non-finite exactly where it is, the rest explained."""
    if pred.shape != a.shape:
        return False
    wild = ~np.isfinite(pred)
    if not wild.any() or not np.array_equal(wild, ~np.isfinite(a)):
        return False
    tame = ~wild
    return not (bad & tame).any() or explains(a[tame], b[tame], pred[tame], bad[tame], atol, 0.0)


def _backward_cause(fixture: Fixture, d: FirstDivergence, a: np.ndarray, golden: GradOutput) -> str:
    """The known backward bug that explains the candidate `a` at `d` (a case's gradient), "" when none does."""
    tap, case, tier = d.tap.removesuffix(GRAD_SUFFIX), d.case, d.golden
    grads = golden[case]
    b = _f64(grads[d.tap])
    if a.shape != b.shape:
        return ""
    bad = ~close(a, b, d.atol, 0.0) & np.isfinite(b)

    def forward(name: str) -> np.ndarray:
        return _f64(fixture.golden_tap(tier, case, name))  # type: ignore[arg-type]

    def grad(name: str) -> np.ndarray:
        return _f64(grads[name + GRAD_SUFFIX])

    def fits(pred: np.ndarray) -> bool:
        return explains(a, b, pred, bad, d.atol, 0.0)

    config = fixture.model.config
    ln = _ln_of(tap, config.n_layer)
    if ln is not None:
        dn, s, n = grad(f"{ln}.hook_normalized"), forward(f"{ln}.hook_scale"), forward(f"{ln}.hook_normalized")
        if fits(b + dn.mean(axis=-1, keepdims=True) / s):
            return (f"{LN_NO_MEAN} ({ln}): the gradient is the golden's + mean(dn) / scale, the term through the "
                    "input's mean dropped: dx = (dn - n mean(dn n)) / s")
        if fits(b + n * (dn * n).mean(axis=-1, keepdims=True) / s):
            return f"{LN_NO_VARIANCE} ({ln}): the gradient is the golden's + n mean(dn n) / scale"
    if tap.endswith("attn.hook_attn_scores"):
        s, dp = forward(tap), grad(tap.replace("hook_attn_scores", "hook_pattern"))
        with np.errstate(invalid="ignore", over="ignore"):
            pred = s * (dp - (dp * s).sum(axis=-1, keepdims=True))
        if _explains_nonfinite(a, b, pred, bad, d.atol) or fits(pred):
            return (f"{SOFTMAX_FROM_INPUT} (the scores) instead of its output (the pattern): ds = s (dp - sum dp s), "
                    "non-finite on every row with a masked (-inf) score")
    if tap.endswith("mlp.hook_pre"):
        exact = getattr(config, "activation", "gelu") != "gelu_new"
        pred = grad(tap.replace("hook_pre", "hook_post")) * _gelu_slope(forward(tap), exact=not exact)
        if fits(pred):
            return (f"{GELU_TANH_DERIVATIVE} (gelu_new's) for the exact GELU's forward" if exact else
                    f"{GELU_EXACT_DERIVATIVE} for gelu_new's (tanh) forward")
    if tap.endswith(("attn.hook_q", "attn.hook_k")):
        dh = config.d_model // config.n_head
        for r, cause in ((math.sqrt(dh), SCALE_MISSING), (1.0 / math.sqrt(dh), SCALE_TWICE)):
            if fits(b * r):
                return f"{cause}: the q and k gradients are {r:.4g} x the golden's (d_head = {dh})"
    if tap == "wte.weight":
        tokens = np.asarray(fixture.case(case).tokens, dtype=np.int64)
        lookup = np.zeros_like(b)  # (V, d)
        np.add.at(lookup, tokens, grad("hook_embed"))  # the lookup's share: each position's row at its token
        if fits(b - lookup):
            return (f"{TIED_ONE_USE}: the unembedding's only (the golden's minus the lookup's share, "
                    "hook_embed.grad's rows at the case's tokens)")
        if fits(lookup):
            return f"{TIED_ONE_USE}: the lookup's only (hook_embed.grad's rows at the case's tokens)"
    return ""


# -- the training step: a record of step s at its first divergence ---------------------------------------------------


def _adamw_variants(fixture: Fixture, name: str, step: int, train: TrainOutput) -> list[tuple[np.ndarray, str]]:
    """Parameter `name` after step `step`, AdamW replayed from the golden's step before with one thing changed."""
    spec = fixture.training()
    assert spec is not None
    b1, b2 = spec.betas
    lr, t = spec.lr[step - 1], step
    before = _f64(fixture.weights()[name] if step == 1 else train[step_key(step - 1, name)])
    m = np.zeros_like(before)
    v = np.zeros_like(before)
    for s in range(1, step + 1):  # the moments from the golden's batch gradients (they agree up to here)
        g = _f64(train[step_key(s, name + GRAD_SUFFIX)])
        m, v = b1 * m + (1.0 - b1) * g, b2 * v + (1.0 - b2) * g * g

    def update(p: np.ndarray, c1: float, c2: float) -> np.ndarray:
        return np.asarray(p - (lr / c1) * m / (np.sqrt(v) / math.sqrt(c2) + spec.eps))

    decays = spec.decays(name)
    decayed = before * (1.0 - lr * spec.weight_decay) if decays else before
    out: list[tuple[np.ndarray, str]] = []
    for k in (1, -1):
        if t + k >= 1:
            out.append((update(decayed, 1.0 - b1 ** (t + k), 1.0 - b2 ** (t + k)),
                        f"{BIAS_CORRECTION}: 1 - b^{t + k} for 1 - b^{t} at step {t}"))
    out.append((update(decayed, 1.0, 1.0), f"{NO_BIAS_CORRECTION}: m / (sqrt(v) + eps) without 1 - b^t"))
    if spec.weight_decay != 0.0:
        c1, c2 = 1.0 - b1**t, 1.0 - b2**t
        if decays:
            out.append((update(before, c1, c2), f"{DECAY_MISSING} on {name}, which the spec decays"))
        else:
            out.append((update(before * (1.0 - lr * spec.weight_decay), c1, c2),
                        f"{DECAY_EXCLUDED}: {name} decayed by lr x {spec.weight_decay:g}, though the spec's no_decay "
                        "excludes it"))
    return out


def _train_cause(fixture: Fixture, d: FirstDivergence, a: np.ndarray, train: TrainOutput,
                 tol: GradTolerances) -> str:
    """The known training-step bug that explains the candidate `a` at `d` (step d.step's record), "" when none."""
    step, name = d.step, d.tap
    assert step is not None
    b = _f64(train[step_key(step, name)])
    if a.shape != b.shape:
        return ""
    atol = d.atol + _f64(tol.allowance.get((d.golden, step_key(step, name)), 0.0))  # the judge's, per element
    bad = ~close(a, b, atol, 0.0) & np.isfinite(b)  # type: ignore[arg-type]
    params = fixture.model.param_shapes()
    if name == "grad_norm" and step >= 2:
        total = sum(float(np.sum(sum(_f64(train[step_key(s, p + GRAD_SUFFIX)]) for s in range(1, step + 1)) ** 2))
                    for p in params)
        if explains(a, b, np.asarray(math.sqrt(total)), bad, atol, 0.0):  # type: ignore[arg-type]
            return (f"{NOT_ZEROED}: step {step}'s gradient norm is that of the sum of the golden's gradients of steps "
                    f"1..{step} (added into, not zeroed)")
    if name in params:
        for pred, cause in _adamw_variants(fixture, name, step, train):
            if explains(a, b, pred, bad, atol, 0.0):  # type: ignore[arg-type]
                return cause
    return ""


def grad_cause(fixture: Fixture, d: FirstDivergence, candidate: object, golden: tuple[GradOutput, TrainOutput],
               tol: GradTolerances) -> str:
    """The likely cause of one first divergence of the gradient check, from the numbers; "" when no known bug fits.

    `candidate` is the backend's array there (a case's gradient, or a training record of step `d.step`), `golden`
    the tier's goldens (`golden_training` or `lazy_training`), `tol` the judge's tolerances.
    """
    if not isinstance(candidate, np.ndarray) or candidate.dtype.kind != "f":
        return ""
    a = _f64(candidate)
    try:
        with np.errstate(all="ignore"):
            if d.step is None:
                return _backward_cause(fixture, d, a, golden[0])
            return _train_cause(fixture, d, a, golden[1], tol)
    except (KeyError, ValueError, IndexError, FloatingPointError):  # a name or shape a pattern does not know
        return ""


def keep_candidates(kept: Kept, report: GradReport, backend: str, precision: str, grads: GradOutput,
                    train: TrainOutput | None) -> None:
    """Keep what a first divergence of this backend x precision will be at, nothing else (a large model's outputs
    are not held): per tier, the earliest failing gradient of the case with the largest error there and the earliest
    failing training record (`judge.first_divergence`'s choice)."""
    own = kept.setdefault((backend, precision), {})
    for checks, order, is_train in ((report.checks, report.names, False), (report.train_checks, report.train_names,
                                                                           True)):
        if is_train and train is None:
            continue
        place = {n: i for i, n in enumerate(order)}
        worst: dict[str, CheckResult] = {}  # tier -> the check the first divergence will report
        for r in checks:
            if r.backend != backend or r.precision != precision or r.status != FAIL:
                continue
            best = worst.get(r.golden)
            key = ((r.step or 0, place[r.tap]), -(r.max_abs if r.max_abs is not None else math.inf))
            if best is None or key < ((best.step or 0, place[best.tap]),
                                      -(best.max_abs if best.max_abs is not None else math.inf)):
                worst[r.golden] = r
        for r in worst.values():
            if is_train and train is not None and step_key(r.step or 0, r.tap) in train:
                own[("train", step_key(r.step or 0, r.tap))] = train[step_key(r.step or 0, r.tap)]
            elif not is_train and r.tap in grads.get(r.case, {}):
                own[(r.case, r.tap)] = grads[r.case][r.tap]


def name_causes(fixture: Fixture, report: GradReport, kept: Kept,
                goldens: Mapping[str, tuple[GradOutput, TrainOutput]], tol: GradTolerances) -> None:
    """Set the `cause` of every first divergence of the report (backward and training), from the kept candidates."""
    def cause(d: FirstDivergence, key: tuple[str, str]) -> str:
        candidate = kept.get((d.backend, d.precision), {}).get(key)
        return grad_cause(fixture, d, candidate, goldens[d.golden], tol) if candidate is not None else ""

    for d in report.divergences:
        d.cause = cause(d, (d.case, d.tap))
    for d in report.train_divergences:
        d.cause = cause(d, ("train", step_key(d.step or 0, d.tap)))


__all__ = ["Kept", "grad_cause", "keep_candidates", "name_causes"]
