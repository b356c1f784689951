"""Diagnosis: name the likely cause of a first divergence from the numbers themselves.

`diagnose` looks at one failing tensor (the candidate's, the golden's, and where the caller has them the
float64 truth, the float32 golden and the golden of the tap before it) and returns the names of the
patterns that explain its failing cells, most specific first (docs/diagnosis.md):

- ROUNDED_F32: in the fp64 tier, every failing cell is exactly the expected value rounded to float32
  (float64 weights or a float64 tap went through float32 somewhere);
- NOT_CORRECTLY_ROUNDED: against the float64 truth, a failing cell is more than 0.5 eps32 units off
  (eps32 x |truth|) where the float32 golden is within 0.5, and every failing cell is within
  ROUNDING_SIZED units (a rounding-sized error, such as sin/cos computed in float32, not a wrong value);
- SHIFTED: along the position axis, the failing cells hold the expected values of the next or the
  previous position (an off-by-one position);
- SIGN_FLIPPED: every failing cell is the expected value negated;
- MISSING_MASK: the expected tensor holds -inf (a masked score) where the candidate is finite;
- PREVIOUS_TAP: the candidate equals, within tolerance, the golden of the tap before it in dataflow
  order (a hook placed one step early, or a tap returned twice).

With a `TapContext`, the known porting bugs are predicted from the golden's upstream taps: GPT-2's for a
GPT-2 fixture, the Llama family's (RoPE pairing and base, GQA `repeat`, SwiGLU gate/up, RMSNorm eps and
(1 + w)) for a Llama fixture (docs/diagnosis.md, "Known porting bugs").

"Failing" and "equals" use the tier's own rule: |a - b| <= atol + rtol * |b|. It costs a few passes
over one tensor, so the runner calls it once per case and tier, at that case's first failing tap.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    from parity_harness._compare.report import Report
    from parity_reference.config import GPTConfig
    from parity_reference.llama_config import LlamaConfig

ROUNDED_F32 = "got equals expected rounded to float32"
NOT_CORRECTLY_ROUNDED = ("not correctly rounded: over 0.5 eps units where the golden is within 0.5 (a float32 step, "
                         "e.g. positions computed in float32)")
SHIFTED = "the same value at a shifted position"
SIGN_FLIPPED = "sign flipped"
MISSING_MASK = "causal mask missing or shifted: -inf expected, finite got"
PREVIOUS_TAP = "values of the previous tap"

EPS32 = float(np.finfo(np.float32).eps)
ROUNDING_SIZED = 4.0  # eps32 units: the most a failing cell may be off for NOT_CORRECTLY_ROUNDED


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """The tier's rule, cell by cell; an infinity is close only to the same infinity, NaN to nothing."""
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(a) & np.isfinite(b)
        near = np.abs(np.where(finite, a - b, 0.0)) <= atol + rtol * np.abs(np.where(finite, b, 0.0))
        return np.where(finite, near, (a == b) & ~np.isnan(a))


def _rounded_f32(a: np.ndarray, b: np.ndarray, bad: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        rounded = b.astype(np.float32).astype(np.float64)
    return bool(np.all(a[bad] == rounded[bad]))


def _not_correctly_rounded(a: np.ndarray, bad: np.ndarray, truth: np.ndarray, golden32: np.ndarray) -> bool:
    if truth.shape != a.shape or golden32.shape != a.shape:
        return False
    t = truth.astype(np.float64)
    cells = bad & np.isfinite(t) & (t != 0.0)
    if not cells.any():
        return False
    scale = EPS32 * np.abs(np.where(cells, t, 1.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        units = np.abs(a - t) / scale
        golden_units = np.abs(golden32.astype(np.float64) - t) / scale
    if not np.all(units[cells] <= ROUNDING_SIZED):  # NaN fails too: not a rounding-sized error
        return False
    return bool(np.any((units > 0.5) & (golden_units <= 0.5) & cells))


def _take(x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def _shifted(a: np.ndarray, b: np.ndarray, bad: np.ndarray, axis: int, atol: float, rtol: float) -> bool:
    """actual[t] == expected[t + s] (s = +1 or -1) at most of the failing cells, and at all those it can."""
    n = a.shape[axis]
    if n < 2:
        return False
    for s in (1, -1):
        lo, hi = (0, n - 1) if s == 1 else (1, n)  # the positions t of `actual` that have a t + s
        a_part, bad_part = _take(a, axis, lo, hi), _take(bad, axis, lo, hi)
        b_part = _take(b, axis, lo + s, hi + s)
        if not bad_part.any() or 2 * int(bad_part.sum()) < int(bad.sum()):
            continue
        if bool(np.all(_close(a_part, b_part, atol, rtol)[bad_part])):
            return True
    return False


def diagnose(
    actual: object, expected: np.ndarray, tier: str, *, atol: float = 0.0, rtol: float = 0.0,
    truth: np.ndarray | None = None, golden32: np.ndarray | None = None, previous: np.ndarray | None = None,
    position_axis: int | None = None, context: TapContext | None = None,
) -> list[str]:
    """The names of the patterns (module docstring) that explain where `actual` breaks `expected`; [] if none.

    `tier` is the golden's precision ("fp32" or "fp64"); `atol`/`rtol` the tier's tolerance for the tap;
    `truth` the float64 golden and `golden32` the float32 golden (for NOT_CORRECTLY_ROUNDED); `previous`
    the golden of the tap before it (PREVIOUS_TAP); `position_axis` the tap's query-position axis (SHIFTED);
    `context` the tap's name, the model's config, the case's goldens and candidate taps, and the weights: with it,
    the known porting bugs are predicted from the golden's upstream taps and matched (`_contextual`).
    """
    if not isinstance(actual, np.ndarray) or actual.dtype.kind not in "fiu":
        return []
    a = actual.astype(np.float64)
    causes: list[str] = []
    if a.shape == expected.shape:
        b = expected.astype(np.float64)
        if np.any(np.isneginf(b) & np.isfinite(a)):
            causes.append(MISSING_MASK)
        bad = ~_close(a, b, atol, rtol) & np.isfinite(b)
        if bad.any():
            if tier == "fp64" and _rounded_f32(a, b, bad):
                causes.append(ROUNDED_F32)
            elif truth is not None and golden32 is not None and _not_correctly_rounded(a, bad, truth, golden32):
                causes.append(NOT_CORRECTLY_ROUNDED)
            if position_axis is not None and 0 <= position_axis < a.ndim and _shifted(a, b, bad, position_axis,
                                                                                      atol, rtol):
                causes.append(SHIFTED)
            if bool(np.all(_close(a[bad], -b[bad], atol, rtol))):
                causes.append(SIGN_FLIPPED)
            if context is not None:
                causes += _contextual(a, b, bad, actual.dtype, atol, rtol, context)
        # the judge fails a result on a coarser grid even within tolerance (judge.coarser_grid_message): named here too
        causes += _grid_causes(a, b, bad, context.precision if context is not None else "")
    if previous is not None and previous.shape == a.shape:
        p = previous.astype(np.float64)
        same_as_expected = p.shape == expected.shape and bool(np.all(_close(expected.astype(np.float64), p,
                                                                             atol, rtol)))
        if not same_as_expected and bool(np.all(_close(a, p, atol, rtol))):
            causes.append(PREVIOUS_TAP)
    return causes


# -- the known porting bugs, predicted from the golden's upstream taps (docs/diagnosis.md, "Known bugs") --------

VARIANCE_UNBIASED = "LayerNorm variance over d - 1"
LN_EPS = "LayerNorm eps"
LN_ONE_PASS = "LayerNorm variance as E[x^2] - E[x]^2"
POST_LN = "post-LN"
ATTENTION_SCALE = "attention scale"
QK_SWAPPED = "q and k swapped"
HEADS_ORDER = "heads split in the wrong order"
SOFTMAX_AXIS = "softmax over the wrong axis"
MASK_LEAK = "causal mask leaks"
SOFTMAX_OVERFLOW = "softmax overflow"
SOFTMAX_SUM = "softmax normalizer wrong"
GELU_TANH = "tanh GELU"
GELU_RELU = "ReLU instead of GELU"
ERF_APPROX = "erf approximated"
ERF_OVERFLOW = "erf overflows"
CONV1D_TRANSPOSE = "Conv1D weight transposed"
FINAL_LN_UNUSED = "final LayerNorm not applied"
UNTIED_OUTPUT = "untied output layer"
OVERFLOW = "overflow"
GRID_BF16 = "on the bfloat16 grid"
GRID_FP16 = "on the float16 grid"

LSTSQ_BUDGET = 5e8  # multiply-adds the untied-output fit may cost (T x d x V): the toy's 1e4, gpt2-small's 4e10 not
MATCH_SLACK = 8.0  # a prediction matches a cell within this many of the tier's tolerances (the golden's own rounding)
MATCH_SHARE = 0.1  # ... and, at a failing cell, within this share of the cell's distance from the golden
_A_S = (0.3275911, 1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)  # A&S 7.1.26


@dataclass(frozen=True)
class TapContext:
    """What a diagnosis may predict from: the tap, the model, this case's goldens (the tier's) and candidate taps.

    `config` is the fixture's model config (`fixture.model.config`): a GPTConfig, or a LlamaConfig for the Llama
    family, whose known bugs have patterns of their own (`_llama_contextual`).
    """

    tap: str
    config: GPTConfig | LlamaConfig
    goldens: Mapping[str, np.ndarray]  # this case's goldens in the tier being judged, by tap
    candidate: Mapping[str, np.ndarray] = field(default_factory=dict)  # the candidate's taps for this case
    weights: Mapping[str, np.ndarray] | None = None  # the fixture's weights (for the weight-layout bugs)
    precision: str = ""  # what the candidate computed in: values on a coarser grid than it are named

    @property
    def gpt(self) -> GPTConfig:
        """The config as GPT-2's: the GPT-2 patterns run only on a GPT-2 fixture (`_contextual`)."""
        return cast("GPTConfig", self.config)

    @property
    def llama(self) -> LlamaConfig:
        """The config as Llama's: the Llama patterns run only on a Llama fixture (`_llama_contextual`)."""
        return cast("LlamaConfig", self.config)

    def golden(self, tap: str) -> np.ndarray | None:
        g = self.goldens.get(tap)
        return None if g is None else np.asarray(g, dtype=np.float64)

    def weight(self, name: str) -> np.ndarray | None:
        w = None if self.weights is None else self.weights.get(name)
        return None if w is None else np.asarray(w, dtype=np.float64)


def _explains(a: np.ndarray, b: np.ndarray, pred: np.ndarray | None, bad: np.ndarray, atol: float,
              rtol: float) -> bool:
    """The prediction matches the candidate at every cell, and at each failing cell far nearer it than the golden."""
    if pred is None or pred.shape != a.shape or not bad.any():
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        both = np.isfinite(a) & np.isfinite(pred)
        if not np.all((a == pred)[~both]):  # infinities the same, no NaN
            return False
        err = np.abs(np.where(both, a - pred, 0.0))
        off = np.abs(np.where(both & np.isfinite(b), a - b, 0.0))
        ok = err <= MATCH_SLACK * (atol + rtol * np.abs(np.where(both, pred, 0.0))) + MATCH_SHARE * off
        return bool(np.all(ok) and np.all(err[bad & both] <= MATCH_SHARE * off[bad & both]))


def _grid_causes(a: np.ndarray, b: np.ndarray, bad: np.ndarray, precision: str) -> list[str]:
    """Overflow (inf where the golden is finite), and values on a coarser grid than the candidate's `precision`
    (float16's in an fp32 or fp64 run, bfloat16's in any other than bf16; "" when it is not known: no grid)."""
    causes: list[str] = []
    if np.any(np.isposinf(a) & np.isfinite(b) & bad):  # -inf is a masked score's value, not a sum past the range
        causes.append(f"{OVERFLOW}: inf where the golden is finite (a sum or product past the dtype's range)")
    # normal float16 numbers only: a smaller value has fewer bits on any grid
    cells = np.isfinite(a) & np.isfinite(b) & (np.abs(a) >= float(np.finfo(np.float16).tiny))
    if not cells.any() or not precision:
        return causes
    x, y = a[cells], b[cells]
    with np.errstate(over="ignore", invalid="ignore"):
        on16 = bool(np.all(x.astype(np.float16).astype(np.float64) == x))
        golden16 = bool(np.all(y.astype(np.float16).astype(np.float64) == y))
        onbf16 = bool(np.all((x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF)) == 0)
                      and np.all(x.astype(np.float32).astype(np.float64) == x))
        goldenbf16 = bool(np.all((y.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF)) == 0))
    if precision in ("fp32", "fp64") and on16 and not golden16:
        causes.append(f"{GRID_FP16}: every value has float16's 11 significant bits (stored or computed in float16)")
    elif precision != "bf16" and onbf16 and not goldenbf16:
        causes.append(f"{GRID_BF16}: every value has bfloat16's 8 significant bits (computed in bfloat16)")
    return causes


_LAYER = re.compile(r"^blocks\.(\d+)\.")


def _layer(tap: str) -> int | None:
    m = _LAYER.match(tap)
    return int(m.group(1)) if m else None


def _ln_input(tap: str, config: GPTConfig) -> str | None:
    """The tap a LayerNorm's scale is taken of."""
    i = _layer(tap)
    if ".ln1." in tap:
        return f"blocks.{i}.hook_resid_pre"
    if ".ln2." in tap:
        return f"blocks.{i}.hook_resid_mid"
    return f"blocks.{config.n_layer - 1}.hook_resid_post" if tap.startswith("ln_final.") else None


def _ln_weights(tap: str) -> str:
    i = _layer(tap)
    return "ln_f." if tap.startswith("ln_final.") else f"h.{i}.ln_{1 if '.ln1.' in tap else 2}."


def _erf_as(u: np.ndarray) -> np.ndarray:
    p, *c = _A_S
    a = np.abs(u)
    t = 1.0 / (1.0 + p * a)
    poly = ((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t
    return np.asarray(np.sign(u) * (1.0 - poly * np.exp(-a * a)))


def _softmax(z: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(z - np.max(z, axis=axis, keepdims=True))
        return np.asarray(e / e.sum(axis=axis, keepdims=True))


def _ln_scale(a: np.ndarray, b: np.ndarray, bad: np.ndarray, dtype: np.dtype, atol: float, rtol: float,
              ctx: TapContext) -> list[str]:
    d, eps = ctx.gpt.d_model, ctx.gpt.ln_eps
    var = np.maximum(b * b - eps, 0.0)
    if _explains(a, b, np.sqrt(var * d / (d - 1) + eps), bad, atol, rtol):
        return [f"{VARIANCE_UNBIASED}: the scale is sqrt(d/(d-1)) = {math.sqrt(d / (d - 1)):.4f} x the golden's "
                f"(d = {d}): the unbiased variance instead of the biased one"]
    fin = bad & np.isfinite(a)
    if fin.any():
        delta = float(np.median((a * a - b * b)[fin]))
        if delta != 0.0 and eps + delta >= 0.0 and _explains(a, b, np.sqrt(np.maximum(b * b + delta, 0.0)), bad, atol,
                                                            rtol):
            return [f"{LN_EPS}: {eps + delta:.2g} instead of {eps:g} (scale^2 - golden^2 is the constant "
                    f"{delta:+.2g})"]
    source = _ln_input(ctx.tap, ctx.gpt)
    x = None if source is None else ctx.golden(source)
    if x is not None and x.shape[:-1] == a.shape[:-1]:  # cancellation: error ~ eps |mean|^2 where |mean| >> std
        mean2 = np.mean(x, axis=-1, keepdims=True) ** 2
        eps_c = float(np.finfo(dtype).eps) if dtype.kind == "f" else 0.0
        with np.errstate(invalid="ignore"):
            err2 = np.where(np.isfinite(a), np.abs(a * a - b * b), b * b)
        rows = bad & (mean2 > 100.0 * var)
        if rows.any() and bool(np.all(rows == bad)) and bool(np.all(err2[bad] <= 4 * d * eps_c * mean2[bad])):
            return [f"{LN_ONE_PASS}: the failing rows have |mean| >> std and errors of eps x mean^2 (cancellation)"]
    if ".ln1." in ctx.tap:
        i = _layer(ctx.tap)
        resid, attn = ctx.candidate.get(f"blocks.{i}.hook_resid_pre"), ctx.candidate.get(f"blocks.{i}.hook_attn_out")
        if resid is not None and attn is not None and np.shape(resid) == np.shape(attn):
            y = np.asarray(resid, dtype=np.float64) + np.asarray(attn, dtype=np.float64)
            pred = np.sqrt(np.var(y, axis=-1, keepdims=True) + eps)
            if _explains(a, b, pred, bad, atol, rtol):
                return [f"{POST_LN}: LayerNorm after the sublayer, x = LN(x + Attn(x)), instead of GPT-2's pre-LN "
                        "(ln1's scale is that of the candidate's x + attn_out)"]
    return []


def _ln_normalized(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float,
                   ctx: TapContext) -> list[str]:
    s = ctx.golden(ctx.tap.replace("hook_normalized", "hook_scale"))
    if s is None or s.shape[:-1] != a.shape[:-1]:
        return []
    d, eps = ctx.gpt.d_model, ctx.gpt.ln_eps
    pred = b * s / np.sqrt(np.maximum(s * s - eps, 0.0) * d / (d - 1) + eps)
    if _explains(a, b, pred, bad, atol, rtol):
        return [f"{VARIANCE_UNBIASED}: the output is sqrt((d-1)/d) = {math.sqrt((d - 1) / d):.4f} x the golden's "
                f"(d = {d}): the unbiased variance instead of the biased one"]
    return []


def _scores(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    cfg = ctx.gpt
    dh, d = cfg.d_model // cfg.n_head, cfg.d_model
    ratios = {math.sqrt(dh): "no 1/sqrt(d_head) at all", math.sqrt(dh / d): "1/sqrt(d_model) instead of 1/sqrt(d_head)",
              1 / math.sqrt(dh): "1/d_head instead of 1/sqrt(d_head)"}
    for r, what in ratios.items():
        if _explains(a, b, b * r, bad, atol, rtol):
            return [f"{ATTENTION_SCALE}: the scores are {r:.4g} x the golden's ({what})"]
    i = _layer(ctx.tap)
    q, k = ctx.golden(f"blocks.{i}.attn.hook_q"), ctx.golden(f"blocks.{i}.attn.hook_k")
    if q is not None and k is not None and q.ndim == 3 and q.shape == k.shape:
        swapped = np.einsum("jhe,ihe->hij", q, k) / math.sqrt(q.shape[-1])  # k_i . q_j
        if swapped.shape == a.shape and _explains(a, b, np.where(np.isneginf(b), -np.inf, swapped), bad, atol, rtol):
            return [f"{QK_SWAPPED}: the scores are k_i . q_j, the transpose of q_i . k_j"]
    return []


def _pattern(a: np.ndarray, b: np.ndarray, bad: np.ndarray, dtype: np.dtype, atol: float, rtol: float,
             ctx: TapContext) -> list[str]:
    i = _layer(ctx.tap)
    scores = ctx.golden(f"blocks.{i}.attn.hook_attn_scores") if i is not None else None
    if ctx.tap.endswith("hook_pattern") and scores is not None and scores.shape == a.shape:
        if _explains(a, b, _softmax(scores, -2), bad, atol, rtol):
            return [f"{SOFTMAX_AXIS}: the pattern is the softmax over queries (axis -2), not keys"]
        masked = np.isneginf(scores)
        leak = np.any(masked & (a != 0.0) & np.isfinite(a), axis=-1, keepdims=True)
        if masked.any() and bool(np.all(np.broadcast_to(leak, a.shape)[bad])):
            return [f"{MASK_LEAK}: every failing row gives masked (future) keys a nonzero weight (an additive mask "
                    "such as -1e4 instead of -inf)"]
        finite_max = float(np.max(np.where(np.isfinite(scores), scores, -np.inf)))
        limit = math.log(float(np.finfo(dtype).max)) if dtype.kind == "f" else math.inf
        if np.any(np.isnan(a) & bad) and finite_max > limit:
            return [f"{SOFTMAX_OVERFLOW}: NaN where exp(score) overflows (a score of {finite_max:.4g} > "
                    f"{limit:.1f}): the row max not subtracted"]
    if not bool(np.all(np.isfinite(a) & (a >= 0.0))):  # not probabilities: no normalizer to blame
        return []
    sums, golden_sums = a.sum(axis=-1, keepdims=True), b.sum(axis=-1, keepdims=True)
    if not bool(np.all(np.abs(golden_sums - 1.0) <= 1e-3)):  # the golden is not a softmax over the last axis
        return []
    # each row the golden's scaled by its own constant: the exponentials right, their sum (the normalizer) wrong
    if _explains(a, b, b * (sums / golden_sums), bad, atol, rtol):
        worst = float(np.max(np.abs(sums - 1.0)))
        return [f"{SOFTMAX_SUM}: each failing row is the golden's times a constant, its sum off 1 by up to "
                f"{worst:.3g} (the normalizer accumulated wrong, e.g. a running sum in float16)"]
    return []


def _gelu(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    pre = ctx.golden(ctx.tap.replace("hook_post", "hook_pre"))
    if pre is None or pre.shape != a.shape:
        return []
    tanh = 0.5 * pre * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (pre + 0.044715 * pre**3)))
    candidates: dict[str, np.ndarray] = {
        f"{GELU_TANH}: GPT-2's gelu_new instead of the exact erf GELU (the difference is gelu_tanh(pre) - "
        "gelu(pre))": tanh,
        f"{GELU_RELU}: the output is max(pre, 0)": np.maximum(pre, 0.0),
        f"{ERF_APPROX}: GELU with the Abramowitz-Stegun 7.1.26 erf polynomial (error 1.5e-7)":
            0.5 * pre * (1.0 + _erf_as(pre / math.sqrt(2.0))),
    }
    for name, pred in candidates.items():
        if _explains(a, b, pred, bad, atol, rtol):
            return [name]
    nan = np.isnan(a) & bad
    if nan.any() and bool(np.all(np.abs(pre[nan]) / math.sqrt(2.0) > math.sqrt(709.78) * 0.99)):
        return [f"{ERF_OVERFLOW}: NaN exactly where |pre| / sqrt(2) > 26.6 (an erf whose terms overflow, inf x 0)"]
    return []


def _attn_out(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    i = _layer(ctx.tap)
    z, w, bias = ctx.golden(f"blocks.{i}.attn.hook_z"), ctx.weight(f"h.{i}.attn.c_proj.weight"), \
        ctx.weight(f"h.{i}.attn.c_proj.bias")
    if z is None or w is None or bias is None or w.shape[0] != w.shape[1]:
        return []
    pred = z.reshape(z.shape[0], -1) @ w.T + bias
    if _explains(a, b, pred, bad, atol, rtol):
        return [f"{CONV1D_TRANSPOSE}: c_proj used as nn.Linear [out, in], x @ W^T instead of Conv1D's x @ W"]
    return []


def _heads(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float) -> list[str]:
    if a.ndim != 3:
        return []
    T, H, dh = a.shape
    c = np.arange(H * dh)
    pred = b.reshape(T, H * dh)[:, (c % dh) * H + c // dh].reshape(a.shape)
    if _explains(a, b, pred, bad, atol, rtol):
        return [f"{HEADS_ORDER}: the columns read as [d_head, H] instead of [H, d_head]"]
    return []


def _logits(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    wte = ctx.weight("wte.weight")
    resid = ctx.golden(f"blocks.{ctx.gpt.n_layer - 1}.hook_resid_post")
    if wte is None or resid is None or resid.shape[-1] != wte.shape[-1]:
        return []
    if _explains(a, b, resid @ wte.T, bad, atol, rtol):
        return [f"{FINAL_LN_UNUSED}: the logits are the raw residual stream @ wte^T"]
    norm, g, beta = ctx.golden("ln_final.hook_normalized"), ctx.weight("ln_f.weight"), ctx.weight("ln_f.bias")
    if norm is None or g is None or beta is None or norm.shape[0] <= norm.shape[1] + 1 or \
            norm.shape[0] * norm.shape[1] * a.shape[-1] > LSTSQ_BUDGET:
        return []  # too few rows to tell a linear map from anything, or too large a fit
    x = np.concatenate([norm * g + beta, np.ones((norm.shape[0], 1))], axis=1)
    fin = np.all(np.isfinite(a), axis=-1)
    m, *_ = np.linalg.lstsq(x[fin], a[fin], rcond=None)
    if fin.all() and _explains(a, b, x @ m, bad, atol, rtol):
        return [f"{UNTIED_OUTPUT}: the logits are a linear map of the final LayerNorm's output, but not wte^T "
                "(an lm_head of its own)"]
    return []


def _contextual(a: np.ndarray, b: np.ndarray, bad: np.ndarray, dtype: np.dtype, atol: float, rtol: float,
                ctx: TapContext) -> list[str]:
    """The known porting bugs at this tap (each predicted from the golden's upstream taps), first that fits."""
    tap = ctx.tap
    checks: list[Callable[[], list[str]]] = []
    if _is_llama(ctx):
        checks.append(lambda: _llama_contextual(a, b, bad, atol, rtol, ctx))
    elif tap.endswith(".hook_scale"):
        checks.append(lambda: _ln_scale(a, b, bad, dtype, atol, rtol, ctx))
    elif tap.endswith(".hook_normalized"):
        checks.append(lambda: _ln_normalized(a, b, bad, atol, rtol, ctx))
    elif tap.endswith("attn.hook_attn_scores"):
        checks.append(lambda: _scores(a, b, bad, atol, rtol, ctx))
    elif tap.endswith("attn.hook_pattern") or tap == "probs" or tap.startswith("logit_lens."):
        checks.append(lambda: _pattern(a, b, bad, dtype, atol, rtol, ctx))
    elif tap.endswith("mlp.hook_post"):
        checks.append(lambda: _gelu(a, b, bad, atol, rtol, ctx))
    elif tap.endswith(".hook_attn_out"):
        checks.append(lambda: _attn_out(a, b, bad, atol, rtol, ctx))
    elif re.search(r"attn\.hook_[qkv]$", tap):
        checks.append(lambda: _heads(a, b, bad, atol, rtol))
    elif tap == "logits":
        checks.append(lambda: _logits(a, b, bad, atol, rtol, ctx))
    for check in checks:
        try:
            found = check()
        except (ValueError, IndexError, FloatingPointError):  # a shape this pattern does not know: no cause
            found = []
        if found:
            return found
    return []


# -- the Llama family's known porting bugs (docs/diagnosis.md, "Known bugs: Llama") ------------------------------

ROPE_PAIRING = "RoPE pairing swapped"
ROPE_BASE = "RoPE base"
GQA_REPEAT = "grouped-query heads repeated, not interleaved"
SWIGLU_SWAPPED = "SwiGLU gate and up swapped"
RMS_EPS = "RMSNorm eps"
RMS_ONE_PLUS_W = "RMSNorm weight applied as (1 + w)"
ROPE_BASES = (10000.0, 500000.0, 1000000.0, 100000.0, 1000.0)  # the bases real checkpoints use, tried first


def _is_llama(ctx: TapContext) -> bool:
    return hasattr(ctx.config, "rope_pairing")  # LlamaConfig; GPTConfig has no RoPE


def _rope(x: np.ndarray, base: float, pairing: str) -> np.ndarray:
    """x (T, heads, dh) rotated as parity_reference.llama_model.apply_rope does, in float64."""
    dh = x.shape[-1]
    angle = np.arange(x.shape[0], dtype=np.float64)[:, None] * base ** (-np.arange(0, dh, 2) / dh)  # (T, dh/2)
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    if pairing == "half":
        x1, x2 = x[..., :dh // 2], x[..., dh // 2:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return np.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(x.shape)


def _fitted_base(a: np.ndarray, x: np.ndarray, pairing: str) -> float | None:
    """The RoPE base that turns x into a at position 1, pair 1 (angle base^(-2/dh) < 1 rad: no wrap); median."""
    if a.ndim != 3 or a.shape[0] < 2 or a.shape[-1] < 4:
        return None
    dh = a.shape[-1]
    cols = (1, 1 + dh // 2) if pairing == "half" else (2, 3)
    x1, x2, r1, r2 = x[1, :, cols[0]], x[1, :, cols[1]], a[1, :, cols[0]], a[1, :, cols[1]]
    angle = np.arctan2(x1 * r2 - x2 * r1, x1 * r1 + x2 * r2)
    angle = angle[np.isfinite(angle) & (np.hypot(x1, x2) > 0.0)]
    if angle.size == 0 or float(np.median(angle)) <= 0.0 or float(np.median(angle)) >= 1.0:
        return None
    return float(float(np.median(angle)) ** (-dh / 2.0))


def _rot(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    cfg = ctx.llama
    x = ctx.golden(ctx.tap.replace("hook_rot_", "hook_"))
    if x is None or x.shape != a.shape:
        return []
    base, pairing = float(cfg.rope_base), str(cfg.rope_pairing)
    other = "interleaved" if pairing == "half" else "half"
    if _explains(a, b, _rope(x, base, other), bad, atol, rtol):
        pairs = "(2j, 2j+1), Meta's" if other == "interleaved" else "(j, j + d_head/2), Hugging Face's"
        return [f"{ROPE_PAIRING}: the rotation pairs columns {pairs} {other} pairing, instead of the model's "
                f"{pairing} (recomputed from the golden's pre-rotation tap)"]
    fitted = _fitted_base(a, x, pairing)
    tried = [*ROPE_BASES, *([fitted] if fitted is not None else [])]
    for wrong in tried:
        if abs(wrong - base) > 1e-6 * base and _explains(a, b, _rope(x, wrong, pairing), bad, atol, rtol):
            return [f"{ROPE_BASE}: the rotation is the golden's with base {wrong:.6g} instead of {base:g}"]
    return []


def _gqa_scores(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float,
                ctx: TapContext) -> list[str]:
    i = _layer(ctx.tap)
    q, k = ctx.golden(f"blocks.{i}.attn.hook_rot_q"), ctx.golden(f"blocks.{i}.attn.hook_rot_k")
    if q is None or k is None or q.ndim != 3 or k.ndim != 3 or q.shape[1] % k.shape[1] or k.shape[1] == q.shape[1]:
        return []
    H, Hkv = q.shape[1], k.shape[1]
    kh = k[:, np.arange(H) % Hkv]  # (T, H, dh): query head h reads kv head h % n_kv (torch `repeat`)
    pred = np.einsum("ihe,jhe->hij", q, kh) / math.sqrt(q.shape[-1])
    if pred.shape != a.shape:
        return []
    if _explains(a, b, np.where(np.isneginf(b), -np.inf, pred), bad, atol, rtol):
        return [f"{GQA_REPEAT}: query head h reads kv head h % {Hkv} (`repeat`) instead of h // {H // Hkv} "
                "(`repeat_interleave`)"]
    return []


def _rms_scale(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    eps = float(ctx.llama.rms_eps)
    fin = bad & np.isfinite(a)
    if not fin.any():
        return []
    delta = float(np.median((a * a - b * b)[fin]))
    if delta != 0.0 and eps + delta >= 0.0 and _explains(a, b, np.sqrt(np.maximum(b * b + delta, 0.0)), bad, atol,
                                                        rtol):
        return [f"{RMS_EPS}: {eps + delta:.2g} instead of {eps:g} (scale^2 - golden^2 is the constant {delta:+.2g})"]
    return []


def _llama_q(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    i = _layer(ctx.tap)
    which = ctx.tap[-1]
    norm, gain = ctx.golden(f"blocks.{i}.ln1.hook_normalized"), ctx.weight(f"model.layers.{i}.input_layernorm.weight")
    w = ctx.weight(f"model.layers.{i}.self_attn.{which}_proj.weight")
    if norm is None or gain is None or w is None or norm.shape[-1] != w.shape[-1]:
        return []
    pred = (norm * (1.0 + gain)) @ w.T
    bias = ctx.weight(f"model.layers.{i}.self_attn.{which}_proj.bias")
    pred = (pred if bias is None else pred + bias).reshape(a.shape) if pred.size == a.size else None
    if _explains(a, b, pred, bad, atol, rtol):
        return [f"{RMS_ONE_PLUS_W}: the normalized input times (1 + w) (Gemma's convention) instead of Llama's w"]
    return []


def _llama_contextual(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float,
                      ctx: TapContext) -> list[str]:
    """The Llama family's known bugs at this tap, each recomputed from the golden's upstream taps and the weights."""
    tap = ctx.tap
    if re.search(r"attn\.hook_rot_[qk]$", tap):
        return _rot(a, b, bad, atol, rtol, ctx)
    if tap.endswith("attn.hook_attn_scores"):
        return _gqa_scores(a, b, bad, atol, rtol, ctx)
    if tap.endswith("mlp.hook_pre"):
        up = ctx.golden(tap + "_linear")
        if _explains(a, b, up, bad, atol, rtol):
            return [f"{SWIGLU_SWAPPED}: the gate (hook_pre) is the golden's up projection (hook_pre_linear)"]
        return []
    if tap.endswith(".hook_scale"):
        return _rms_scale(a, b, bad, atol, rtol, ctx)
    if re.search(r"attn\.hook_[qkv]$", tap):
        return _llama_q(a, b, bad, atol, rtol, ctx)
    return []


# -- decoding: a step's first failing tap, against the golden's previous step and one-step variants -----------------

CACHE_TRANSPOSED = "cache layout transposed"
STALE_CACHE = "stale cache"
DECODE_POSITION = "the new token at a wrong position"
OWN_KEY_UNSEEN = "cache appended after use"
MLP_WEIGHTS = ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias")
POSITION_OFFSETS = (-2, -1, 1, 2)  # the wrong positions tried besides 0 (not offset by the cache length at all)
SINGLE_QUERY_MASK = "mask wrong at T = 1"


@dataclass(frozen=True)
class StepContext:
    """What a decoding step's diagnosis predicts from: the model, its weights, the fed token and the golden's cache."""

    config: GPTConfig
    weights: Mapping[str, np.ndarray]
    token: int  # the token fed at this step
    position: int  # its position: the cache's length before the step
    previous: Mapping[str, np.ndarray]  # the golden's decoding taps at the step before (its cache)
    precision: str = ""  # what the candidate computed in


def _one_step(ctx: StepContext, position: int, attend: str) -> dict[str, np.ndarray]:
    """The step's taps when the token sits at `position` and its query attends to `attend`: "all" the keys (the
    honest step), "cached" (all but its own), or "first" (key 0 only)."""
    from parity_reference.numpy_model import layer_norm, mlp, sinusoidal_positions, softmax, unembed

    cfg = ctx.config

    def param(name: str) -> np.ndarray:  # in float64, one weight at a time (a large model is never copied whole)
        return np.asarray(ctx.weights[name], dtype=np.float64)

    d, H = cfg.d_model, cfg.n_head
    dh = d // H
    pos_embed = np.asarray(ctx.weights["wpe.weight"][position:position + 1], dtype=np.float64) \
        if cfg.positions == "learned" else sinusoidal_positions(position + 1, d, np.float64)[position:]
    x = np.asarray(ctx.weights["wte.weight"][[ctx.token]], dtype=np.float64) + pos_embed  # (1, d)
    taps: dict[str, np.ndarray] = {}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        cache_k = np.asarray(ctx.previous[f"blocks.{i}.attn.cache_k"], dtype=np.float64)  # (H, T, dh)
        cache_v = np.asarray(ctx.previous[f"blocks.{i}.attn.cache_v"], dtype=np.float64)
        ln1 = layer_norm(x, param(p + "ln_1.weight"), param(p + "ln_1.bias"), cfg.ln_eps, {}, "")
        qkv = ln1 @ param(p + "attn.c_attn.weight") + param(p + "attn.c_attn.bias")  # (1, 3d)
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(1, H, dh).transpose(1, 0, 2) for j in range(3))  # (H, 1, dh)
        keys, values = np.concatenate([cache_k, k], axis=1), np.concatenate([cache_v, v], axis=1)
        seen = {"all": slice(None), "cached": slice(0, -1), "first": slice(0, 1)}[attend]
        weights = softmax(q @ keys[:, seen].transpose(0, 2, 1) / math.sqrt(dh))  # (H, 1, n)
        z = (weights @ values[:, seen]).transpose(1, 0, 2).reshape(1, d)
        mid = x + z @ param(p + "attn.c_proj.weight") + param(p + "attn.c_proj.bias")
        ln2 = layer_norm(mid, param(p + "ln_2.weight"), param(p + "ln_2.bias"), cfg.ln_eps, {}, "")
        x = mid + mlp(ln2, {k: param(p + "mlp." + k) for k in MLP_WEIGHTS}, "", {}, "")
        taps[f"blocks.{i}.attn.cache_k"], taps[f"blocks.{i}.attn.cache_v"] = keys, values
    taps["logits"] = unembed(x, {k: param(k) for k in ("ln_f.weight", "ln_f.bias", "wte.weight")}, cfg, {}, "")[0]
    return taps


def diagnose_step(
    actual: object, expected: np.ndarray, tap: str, step: int, *, atol: float = 0.0, rtol: float = 0.0,
    context: StepContext | None = None,
) -> list[str]:
    """The likely cause of a decoding step's first failing tap (docs/diagnosis.md, "Decoding"); [] if none fits.

    A cache tap is [H, T, d_head]. Patterns: the layout transposed ([T, H, d_head] read as [H, T, d_head]); a
    stale cache (the step's cache is the previous step's); and, from `context`, the step recomputed from the golden's
    previous cache with the new token at another position, or its query attending to the cached keys only (the
    cache appended after use) or to key 0 only (a square mask's first row: a mask wrong at T = 1).
    """
    if not isinstance(actual, np.ndarray) or actual.dtype.kind not in "fiu":
        return []
    a, b = actual.astype(np.float64), np.asarray(expected, dtype=np.float64)
    previous = None if context is None or step == 0 else context.previous.get(tap)
    if (previous is not None and a.shape == np.shape(previous) and a.shape != b.shape
            and bool(np.all(_close(a, np.asarray(previous, dtype=np.float64), atol, rtol)))):
        return [f"{STALE_CACHE}: step {step}'s {tap.rsplit('.', 1)[-1]} is step {step - 1}'s (not updated)"]
    if a.shape != b.shape:
        return []
    bad = ~_close(a, b, atol, rtol) & np.isfinite(b)
    if not bad.any():
        return []
    causes: list[str] = []
    if a.ndim == 3 and _explains(a, b, b.transpose(1, 0, 2).reshape(b.shape), bad, atol, rtol):
        causes.append(f"{CACHE_TRANSPOSED}: the cache stored [T, H, d_head] and read as [H, T, d_head]")
    elif previous is not None and a.ndim == 3 and a.shape[1] >= 2 and _explains(
            a, b, np.concatenate([b[:, :-1], b[:, -2:-1]], axis=1), bad, atol, rtol):
        causes.append(f"{STALE_CACHE}: the new position's row repeats the previous one (the cache not updated)")
    if context is not None and step > 0 and not causes:
        causes += _step_variants(a, b, bad, tap, atol, rtol, context)
    if not causes and context is not None and context.precision in ("fp32", "fp64"):
        finite = np.isfinite(a)
        with np.errstate(over="ignore"):
            on16 = a[finite].astype(np.float16).astype(np.float64) == a[finite]
        if finite.any() and bool(np.all(on16)) and not bool(np.all(b.astype(np.float16).astype(np.float64) == b)):
            causes.append(f"{GRID_FP16}: every value has float16's 11 significant bits (the cache stored in float16)")
    return causes


def _step_variants(a: np.ndarray, b: np.ndarray, bad: np.ndarray, tap: str, atol: float, rtol: float,
                   ctx: StepContext) -> list[str]:
    try:
        for attend, name in (("cached", f"{OWN_KEY_UNSEEN}: the new token's query does not see its own key and "
                                        "value (the cache grown after attention)"),
                             ("first", f"{SINGLE_QUERY_MASK}: the single-token query sees key 0 only (the square "
                                       "mask's first row applied to a one-query step)")):
            if _explains(a, b, _one_step(ctx, ctx.position, attend).get(tap), bad, atol, rtol):
                return [name]
        tried = dict.fromkeys(p for p in (0, *(ctx.position + o for o in POSITION_OFFSETS))
                              if 0 <= p < ctx.config.n_ctx)
        for position in tried:
            if position != ctx.position and _explains(a, b, _one_step(ctx, position, "all").get(tap), bad, atol,
                                                      rtol):
                offset = position - ctx.position
                return [f"{DECODE_POSITION}: encoded at position {position} instead of {ctx.position} "
                        f"(offset {offset:+d}{': not offset by the cache length' if position == 0 else ''})"]
    except (KeyError, ValueError, IndexError):  # a model this recomputation does not know: no cause
        return []
    return []


# -- stale goldens: only the backend that made them disagrees -----------------------------------------------------

GOLDEN_MAKER = "pytorch"  # `parity export` computes every golden with the PyTorch reference (reference_taps)


def golden_maker(provenance: Mapping[str, object]) -> str | None:
    """The backend that computes the goldens the way they were made, from a manifest's provenance; None if unknown.

    An explicit `golden_backend` wins; a fixture made by `parity export` (its `command`) or whose provenance says
    `golden: reference.model.run_with_taps` was made by the PyTorch reference, the `pytorch` backend.
    """
    explicit = provenance.get("golden_backend")
    if isinstance(explicit, str) and explicit:
        return explicit
    command, weights = provenance.get("command"), provenance.get("weights")
    if (isinstance(command, str) and command.startswith("parity export")) or \
            (isinstance(weights, str) and "golden: reference.model.run_with_taps" in weights):
        return GOLDEN_MAKER
    return None


def stale_golden_hint(report: Report, provenance: Mapping[str, object] | None = None) -> str | None:
    """A hint that the goldens may be stale, or None: the backend that made them (`golden_maker`) is the only one
    that disagrees (forward or decoding), and at least one other backend was compared and agrees with them (so with
    each other). `provenance` is the fixture's manifest's; None reads it from the report's fixture directory."""
    provenance = _read_provenance(report.fixture) if provenance is None else provenance
    maker = golden_maker(provenance) if provenance is not None else None
    if provenance is None or maker is None:
        return None
    checks = [(r.backend, r.passed) for r in report.results]
    if report.decoding is not None:
        checks += [(c.backend, c.passed) for c in report.decoding.checks]
    failing = {backend for backend, passed in checks if passed is False}
    others = {backend for backend, passed in checks if passed is not None} - {maker}
    if failing != {maker} or not others:
        return None
    command = provenance.get("command")
    again = f"`{command}`" if isinstance(command, str) and command.startswith("parity export") else "`parity export`"
    return (f"only {maker}, the backend that made the goldens, disagrees; {', '.join(sorted(others))} "
            f"agree{'s' if len(others) == 1 else ''} with them: the goldens may be stale (the reference changed since "
            f"they were made): `parity export --check` says whether they still reproduce; {again} regenerates them")


def _read_provenance(fixture: str) -> Mapping[str, object] | None:
    """The provenance of the manifest in directory `fixture`, None when there is none to read."""
    import json
    from pathlib import Path

    path = Path(fixture) / "manifest.json" if fixture else None
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return None
    provenance = doc.get("provenance") if isinstance(doc, dict) else None
    return provenance if isinstance(provenance, dict) else None
