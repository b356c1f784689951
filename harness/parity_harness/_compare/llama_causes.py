"""The Llama family's known porting bugs, each recomputed from the golden's upstream taps and the weights
(docs/diagnosis.md, "Known bugs: Llama"): RoPE pairing and base, grouped-query heads `repeat`ed, SwiGLU's gate
and up swapped, RMSNorm's eps and (1 + w). The family table's `causes` module
(`parity_reference/families/llama.json`). It has no `step_replay`: the decoding bugs' replays are GPT-2's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np

from parity_harness._compare.patterns import TapContext
from parity_harness._compare.patterns import explains as _explains
from parity_harness._compare.patterns import layer as _layer

if TYPE_CHECKING:
    from parity_reference.llama_config import LlamaConfig

ROPE_PAIRING = "RoPE pairing swapped"
ROPE_BASE = "RoPE base"
GQA_REPEAT = "grouped-query heads repeated, not interleaved"
SWIGLU_SWAPPED = "SwiGLU gate and up swapped"
RMS_EPS = "RMSNorm eps"
RMS_ONE_PLUS_W = "RMSNorm weight applied as (1 + w)"
ROPE_BASES = (10000.0, 500000.0, 1000000.0, 100000.0, 1000.0)  # the bases real checkpoints use, tried first


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
    cfg = _llama(ctx)
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
    eps = float(_llama(ctx).rms_eps)
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


def _at_tap(a: np.ndarray, b: np.ndarray, bad: np.ndarray, atol: float, rtol: float, ctx: TapContext) -> list[str]:
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


def _llama(ctx: TapContext) -> LlamaConfig:
    """The context's config as Llama's: these patterns run only on a Llama fixture (its table names this module)."""
    return cast("LlamaConfig", ctx.config)


def known_bugs(a: np.ndarray, b: np.ndarray, bad: np.ndarray, dtype: np.dtype, atol: float, rtol: float,
               ctx: TapContext) -> list[Callable[[], list[str]]]:
    """The patterns to try at this tap (`diagnose` runs them)."""
    return [lambda: _at_tap(a, b, bad, atol, rtol, ctx)]
