"""The GPT-2 family's known porting bugs, each predicted from the golden's upstream taps (docs/diagnosis.md,
"Known porting bugs"): the family table's `causes` module (`parity_reference/families/gpt2.json`).

`known_bugs` gives the patterns to try at a tap; `step_replay` recomputes one decoding step from the golden's
previous cache (the decoding bugs' variants: the new token at another position, its query seeing the cached
keys only, or key 0 only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np

from parity_harness._compare.patterns import StepContext, TapContext
from parity_harness._compare.patterns import explains as _explains
from parity_harness._compare.patterns import layer as _layer

if TYPE_CHECKING:
    from parity_reference.config import GPTConfig

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
GELU_EXACT = "exact GELU instead of gelu_new"
GELU_RELU = "ReLU instead of GELU"
GELU_GGML_TABLE = "ggml's GELU table"
GGML_TABLE_SHARE = 0.9  # at least this share of the values bit-identical to the table's prediction
ERF_APPROX = "erf approximated"
ERF_OVERFLOW = "erf overflows"
CONV1D_TRANSPOSE = "Conv1D weight transposed"
FINAL_LN_UNUSED = "final LayerNorm not applied"
UNTIED_OUTPUT = "untied output layer"

# Reduced precision: overflow and accumulation in the precision (the fp16-stress fixture's mutants, docs/selftest.md)
LN_SQUARES_OVERFLOW = "overflow in the LayerNorm's sum of squares"
SOFTMAX_ACCUMULATED = "softmax sum accumulated in"  # + " float16" or " bfloat16"
LOGITS_ACCUMULATED = "logits accumulated in"  # + " float16" or " bfloat16"
SCORES_PRODUCT_OVERFLOW = "overflow in q.k before the 1/sqrt(d_head) scale"
HALF_NAMES = {"fp16": "float16", "bf16": "bfloat16"}
ACCUMULATION_BUDGET = 5e8  # multiply-adds a replayed running sum may cost (rows x V x d at the logits)

LSTSQ_BUDGET = 5e8  # multiply-adds the untied-output fit may cost (T x d x V): the toy's 1e4, gpt2-small's 4e10 not
_A_S = (0.3275911, 1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)  # A&S 7.1.26
MLP_WEIGHTS = ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias")


def _gpt(ctx: TapContext | StepContext) -> GPTConfig:
    """The context's config as GPT-2's: these patterns run only on a GPT-2 fixture (its table names this module)."""
    return cast("GPTConfig", ctx.config)


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
    d, eps = _gpt(ctx).d_model, _gpt(ctx).ln_eps
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
    source = _ln_input(ctx.tap, _gpt(ctx))
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
    d, eps = _gpt(ctx).d_model, _gpt(ctx).ln_eps
    pred = b * s / np.sqrt(np.maximum(s * s - eps, 0.0) * d / (d - 1) + eps)
    if _explains(a, b, pred, bad, atol, rtol):
        return [f"{VARIANCE_UNBIASED}: the output is sqrt((d-1)/d) = {math.sqrt((d - 1) / d):.4f} x the golden's "
                f"(d = {d}): the unbiased variance instead of the biased one"]
    return []


def _scores(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    cfg = _gpt(ctx)
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


def ggml_gelu(pre: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU (GGML_GELU_FP16, ggml-cpu's vec.h): the tanh approximation looked up in a float16 table at the
    input rounded to float16, f16(gelu_tanh(f16(x))); x itself above 10, 0 below -10."""
    f32 = np.float32
    x = np.asarray(pre, dtype=f32).astype(np.float16).astype(f32)  # the table's index: the input in float16
    inner = f32(0.7978845608028654) * x * (f32(1.0) + f32(0.044715) * x * x)  # ggml_gelu_f32, in float32
    table = f32(0.5) * x * (f32(1.0) + np.tanh(inner.astype(np.float64)).astype(f32))  # tanhf: correctly rounded
    out = table.astype(np.float16).astype(np.float64)
    return np.where(pre > 10.0, pre, np.where(pre < -10.0, 0.0, out))


def _ggml_gelu(a: np.ndarray, ctx: TapContext) -> list[str]:
    """ggml's GELU table: the candidate's own hook_post is f16(gelu_tanh(f16(its hook_pre))) at nearly every cell
    (the float32 tanh that fills ggml's table and float64's round apart at a few float16 ties)."""
    pre = ctx.candidate.get(ctx.tap.replace("hook_post", "hook_pre"))
    if pre is None or pre.shape != a.shape or not a.size:
        return []
    share = float(np.mean(ggml_gelu(np.asarray(pre, dtype=np.float64)) == a))
    if share < GGML_TABLE_SHARE:
        return []
    return [f"{GELU_GGML_TABLE}: {share:.1%} of the values are bit for bit f16(gelu_tanh(f16(pre))), ggml's GELU "
            "(GGML_GELU_FP16: the tanh approximation read from a float16 table), a fixed choice of ggml's CPU "
            "backend: float16's 11 bits, and the tanh GELU where the fixture's is exact"]


def _gelu(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
    pre = ctx.golden(ctx.tap.replace("hook_post", "hook_pre"))
    if pre is None or pre.shape != a.shape:
        return []
    table = _ggml_gelu(a, ctx)
    if table:
        return table
    tanh = 0.5 * pre * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (pre + 0.044715 * pre**3)))
    if _gpt(ctx).activation == "gelu_new":  # the fixture's own activation is the tanh one: the reverse mistake
        from parity_reference.numpy_model import gelu

        exact = gelu(np.asarray(pre, dtype=np.float64))
        if _explains(a, b, exact, bad, atol, rtol):
            return [f"{GELU_EXACT}: the exact erf GELU where the fixture's config says \"activation\": "
                    "\"gelu_new\" (GPT-2's tanh GELU; the difference is gelu(pre) - gelu_tanh(pre))"]
        return []
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
    resid = ctx.golden(f"blocks.{_gpt(ctx).n_layer - 1}.hook_resid_post")
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


def round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """x rounded to fp16's or bf16's grid (to nearest, ties to even; bf16 by way of float32), back in float64."""
    if precision == "fp16":
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(np.asarray(x, dtype=np.float64).astype(np.float16), dtype=np.float64)
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.asarray(rounded.view(np.float32), dtype=np.float64)


def _ln_squares_overflow(a: np.ndarray, b: np.ndarray, bad: np.ndarray, ctx: TapContext) -> list[str]:
    """fp16: every failing row of the scale is inf or NaN, and the golden input's sum of squares over d (of x, or
    centered) is past 65,504 there while each square fits: a sum of squares stored in float16."""
    source = _ln_input(ctx.tap, _gpt(ctx))
    x = None if source is None or ctx.precision != "fp16" else ctx.golden(source)
    if x is None or x.shape[:-1] != a.shape[:-1] or not bad.any():
        return []
    limit = float(np.finfo(np.float16).max)
    centered = x - np.mean(x, axis=-1, keepdims=True)  # (T, d)
    one_pass = np.sum(x * x, axis=-1, keepdims=True)  # (T, 1)
    two_pass = np.sum(centered * centered, axis=-1, keepdims=True)  # (T, 1)
    rows = np.broadcast_to(np.maximum(one_pass, two_pass) > limit, a.shape)
    largest = float(np.max(x * x))
    if not bool(np.all(~np.isfinite(a[bad]))) or not bool(np.all(rows[bad])) or largest > limit:
        return []
    return [f"{LN_SQUARES_OVERFLOW}: inf in every failing row, whose sum of squares over d reaches "
            f"{float(np.max(one_pass)):.6g} (sum x^2), {float(np.max(two_pass)):.6g} (centered) > {limit:g} while each "
            f"square is at most {largest:.6g}: a sum of squares stored in float16 (a one-pass sum(x^2)/d - mean^2, "
            "or a running sum)"]


def _scores_product_overflow(a: np.ndarray, b: np.ndarray, bad: np.ndarray, ctx: TapContext) -> list[str]:
    """fp16: every failing score is inf or NaN where the golden score is finite and fits, but the golden times
    sqrt(d_head), the product q.k before its scale, is past 65,504: q @ k^T computed in float16, then scaled."""
    if ctx.precision != "fp16" or not bad.any() or not bool(np.all(~np.isfinite(a[bad]))):
        return []
    root = math.sqrt(_gpt(ctx).d_head)
    limit = float(np.finfo(np.float16).max)
    golden = b[bad]
    if not bool(np.all(np.isfinite(golden))) or not bool(np.all(np.abs(golden) * root > limit)) or \
            float(np.max(np.abs(golden))) > limit:
        return []
    return [f"{SCORES_PRODUCT_OVERFLOW}: inf exactly where the product q.k reaches "
            f"{float(np.max(np.abs(golden)) * root):.6g} > {limit:g} while the scaled score, "
            f"{float(np.max(np.abs(golden))):.6g}, fits: q @ k^T computed in float16, then scaled (scale q, or k, "
            "first)"]


def _softmax_accumulated(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float,
                         ctx: TapContext) -> list[str]:
    """fp16 or bf16: a softmax whose normalizer is a running sum in the precision, replayed from the golden's own
    exp(x - max) (its probabilities over their row's largest), predicts every failing cell."""
    name = HALF_NAMES.get(ctx.precision)
    if name is None or b.ndim < 1 or not bool(np.all(np.isfinite(b) & (b >= 0.0))):
        return []
    top = np.max(b, axis=-1, keepdims=True)  # (..., 1)
    if not bool(np.all(top > 0.0)):
        return []
    e = round_to(b / top, ctx.precision)  # (..., n): exp(x - max) in the precision
    total = np.zeros_like(e[..., :1])  # (..., 1)
    for j in range(e.shape[-1]):
        total = round_to(total + e[..., j : j + 1], ctx.precision)  # (..., 1): each add rounded
    pred = round_to(e / total, ctx.precision)  # (..., n)
    if not _explains(a, b, pred, bad, atol, rtol):
        return []
    exact = e.sum(axis=-1, keepdims=True)  # (..., 1)
    worst = int(np.argmax(np.abs(exact - total)))
    return [f"{SOFTMAX_ACCUMULATED} {name}: softmax normalizer wrong, a running {name} sum of exp(x - max) predicts "
            f"every failing row (it stops at {float(total.flat[worst]):.6g} where the row sums to "
            f"{float(exact.flat[worst]):.6g})"]


def _logits_accumulated(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float,
                        ctx: TapContext) -> list[str]:
    """fp16 or bf16: the logits as a running sum over d in the precision, replayed from the golden final LayerNorm
    and wte (each input, product and partial sum rounded), predict every failing cell."""
    name = HALF_NAMES.get(ctx.precision)
    norm, g, beta = ctx.golden("ln_final.hook_normalized"), ctx.weight("ln_f.weight"), ctx.weight("ln_f.bias")
    wte = ctx.weight("wte.weight")
    if name is None or norm is None or g is None or beta is None or wte is None or norm.ndim != 2 or \
            norm.shape[0] != a.shape[0] or wte.shape != (a.shape[-1], norm.shape[1]) or \
            norm.size * wte.shape[0] > ACCUMULATION_BUDGET:
        return []
    p = ctx.precision
    ln = round_to(round_to(round_to(norm, p) * round_to(g, p), p) + round_to(beta, p), p)  # (T, d)
    w = round_to(wte, p)  # (V, d)
    out = np.zeros(a.shape)  # (T, V)
    for i in range(ln.shape[1]):
        out = round_to(out + round_to(ln[:, i : i + 1] * w[:, i], p), p)  # (T, V): a running sum over d
    if not _explains(a, b, out, bad, atol, rtol):
        return []
    lost = float(np.max(np.abs(out - b)) / max(float(np.max(np.abs(b))), float(np.finfo(np.float64).tiny)))
    return [f"{LOGITS_ACCUMULATED} {name}: a running {name} sum over d of ln_f(x)_i * wte_ji predicts every failing "
            f"cell (terms under half an ulp of the partial sum are lost: up to {lost:.0%} of the largest logit)"]


def known_bugs(a: np.ndarray, b: np.ndarray, bad: np.ndarray, dtype: np.dtype, atol: float, rtol: float,
               ctx: TapContext) -> list[Callable[[], list[str]]]:
    """The patterns to try at this tap, in order (`diagnose` runs them: the first that fits names the cause)."""
    tap = ctx.tap
    checks: list[Callable[[], list[str]]] = []
    if tap.endswith(".hook_scale"):
        checks.append(lambda: _ln_scale(a, b, bad, dtype, atol, rtol, ctx))
        checks.append(lambda: _ln_squares_overflow(a, b, bad, ctx))
    elif tap.endswith(".hook_normalized"):
        checks.append(lambda: _ln_normalized(a, b, bad, atol, rtol, ctx))
    elif tap.endswith("attn.hook_attn_scores"):
        checks.append(lambda: _scores_product_overflow(a, b, bad, ctx))
        checks.append(lambda: _scores(a, b, bad, atol, rtol, ctx))
    elif tap.endswith("attn.hook_pattern") or tap == "probs" or tap.startswith("logit_lens."):
        checks.append(lambda: _softmax_accumulated(a, b, bad, atol, rtol, ctx))
        checks.append(lambda: _pattern(a, b, bad, dtype, atol, rtol, ctx))
    elif tap.endswith("mlp.hook_post"):
        checks.append(lambda: _gelu(a, b, bad, atol, rtol, ctx))
    elif tap.endswith(".hook_attn_out"):
        checks.append(lambda: _attn_out(a, b, bad, atol, rtol, ctx))
    elif re.search(r"attn\.hook_[qkv]$", tap):
        checks.append(lambda: _heads(a, b, bad, atol, rtol))
    elif tap == "logits":
        checks.append(lambda: _logits(a, b, bad, atol, rtol, ctx))
        checks.append(lambda: _logits_accumulated(a, b, bad, atol, rtol, ctx))
    return checks


def step_replay(ctx: StepContext, position: int, attend: str) -> dict[str, np.ndarray]:
    """The step's taps when the token sits at `position` and its query attends to `attend`: "all" the keys (the
    honest step), "cached" (all but its own), or "first" (key 0 only)."""
    from parity_reference.numpy_model import layer_norm, mlp, sinusoidal_positions, softmax, unembed

    cfg = _gpt(ctx)

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
        x = mid + mlp(ln2, {k: param(p + "mlp." + k) for k in MLP_WEIGHTS}, "", cfg, {}, "")
        taps[f"blocks.{i}.attn.cache_k"], taps[f"blocks.{i}.attn.cache_v"] = keys, values
    taps["logits"] = unembed(x, {k: param(k) for k in ("ln_f.weight", "ln_f.bias", "wte.weight")}, cfg, {}, "")[0]
    return taps
