"""The fp16-stress mutants (`FP16_STRESS`, parity_harness/_tools/gpt2_mutants.py): overflow and accumulation in the
precision, each NOT caught when the same code runs in fp32 and fp64 on the fp16-stress fixture, and caught in its
reduced precision at its tap with its cause named from the numbers (parity_harness/_compare/gpt2_causes.py).

- fast: the four cause patterns on numbers made here (a sum of squares past 65,504, a softmax normalizer replayed
  as a running fp16 sum, logits replayed as a running bf16 sum over d, scores whose product q.k passes 65,504
  before the scale): each named where it fits, and not for a random error of the same size, nor in a precision
  where it cannot happen;
- full: the selftest on the exported fixture (`parity selftest --only ...`): each mutant invisible in fp32 and fp64,
  caught in fp16 or bf16 at its tap, with the judge's cause and the likely cause.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parity_harness._compare.diagnose import diagnose
from parity_harness._compare.gpt2_causes import (
    LN_SQUARES_OVERFLOW,
    LOGITS_ACCUMULATED,
    SCORES_PRODUCT_OVERFLOW,
    SOFTMAX_ACCUMULATED,
    round_to,
)
from parity_harness._compare.patterns import TapContext
from parity_harness._tools.gpt2_mutants import FP16_STRESS
from parity_reference.config import GPTConfig
from tests.helpers import run_cli

EPS = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
C = 32.0  # the reduced-precision rule's c (docs/tolerances.md)

# The mutant -> (precision, expected tap, the judge's cause, the likely cause's class)
EXPECTED = {
    "py-fs-ln-one-pass-sum": ("fp16", "blocks.0.ln1.hook_scale", "overflow", LN_SQUARES_OVERFLOW),
    "py-fs-softmax-dtype-sum": ("fp16", "probs", "tolerance", f"{SOFTMAX_ACCUMULATED} float16"),
    "py-fs-logits-dtype-sum": ("bf16", "logits", "tolerance", f"{LOGITS_ACCUMULATED} bfloat16"),
    "py-fs-scores-scaled-after": ("fp16", "blocks.0.attn.hook_attn_scores", "overflow", SCORES_PRODUCT_OVERFLOW),
}


def _named(actual: np.ndarray, golden: np.ndarray, tap: str, precision: str, config: GPTConfig,
           goldens: dict[str, np.ndarray], weights: dict[str, np.ndarray] | None = None) -> list[str]:
    atol = C * EPS[precision] * float(np.max(np.abs(golden[np.isfinite(golden)])))
    ctx = TapContext(tap, config, {**goldens, tap: golden}, {}, weights, precision)
    return diagnose(actual, golden, "fp64", atol=atol, rtol=0.0, context=ctx)


def test_the_catalog_holds_the_four_with_their_precision_and_tap() -> None:
    assert {m.name: (m.precision, m.expected_tap) for m in FP16_STRESS} == {
        name: (p, tap) for name, (p, tap, _, _) in EXPECTED.items()}
    assert all(m.caught_on == "fp16-stress" and m.target == "reference" and not m.fp64_only for m in FP16_STRESS)


def test_round_to_is_fp16s_and_bf16s_rounding() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10_000) * 10.0 ** rng.uniform(-3, 3, 10_000)).astype(np.float32)
    assert np.array_equal(round_to(x, "fp16"), x.astype(np.float16).astype(np.float64))
    got = round_to(x, "bf16")
    # bf16 is float32's top 16 bits: the nearer of the two bf16 neighbours of x (truncated, and one ulp further out)
    low = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    high = ((x.view(np.uint32) & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32).astype(np.float64)
    nearer = np.where(np.abs(high - x) < np.abs(low - x), high, low)
    tie = np.abs(high - x) == np.abs(low - x)
    assert not tie.any() and np.array_equal(got, nearer)
    halfway = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8], dtype=np.float32)  # ties: to the even neighbour
    assert round_to(halfway, "bf16").tolist() == [1.0, 1.0 + 2 * 2.0 ** -7]


def test_a_sum_of_squares_past_65504_is_named_in_fp16_only() -> None:
    config = GPTConfig(vocab_size=8, n_ctx=4, d_model=16, n_layer=1, n_head=2, d_mlp=32, positions="learned")
    x = np.random.default_rng(2).standard_normal((4, 16)) * 0.1  # (T, d)
    x[:, 1], x[:, 2] = 200.0, -200.0  # squares 40,000 each: they fit, their sum does not
    scale = np.sqrt(np.var(x, axis=-1, keepdims=True) + config.ln_eps)  # (T, 1): the golden
    tap, goldens = "blocks.0.ln1.hook_scale", {"blocks.0.hook_resid_pre": x}
    inf = np.full_like(scale, np.inf)
    assert any(c.startswith(LN_SQUARES_OVERFLOW) for c in _named(inf, scale, tap, "fp16", config, goldens))
    assert not any(c.startswith(LN_SQUARES_OVERFLOW) for c in _named(inf, scale, tap, "bf16", config, goldens))
    assert not any(c.startswith(LN_SQUARES_OVERFLOW) for c in _named(scale * 2, scale, tap, "fp16", config, goldens))
    small = x * 0.5  # squares of 10,000: their sum (20,000) fits; an inf there is another bug
    small_scale = np.sqrt(np.var(small, axis=-1, keepdims=True) + config.ln_eps)
    assert not any(c.startswith(LN_SQUARES_OVERFLOW) for c in _named(inf, small_scale, tap, "fp16", config,
                                                                     {"blocks.0.hook_resid_pre": small}))


def test_a_softmax_normalizer_summed_in_fp16_is_named_and_a_random_error_is_not() -> None:
    config = GPTConfig(vocab_size=4096, n_ctx=4, d_model=16, n_layer=1, n_head=2, d_mlp=32, positions="learned")
    logits = np.random.default_rng(3).uniform(-0.1, 0.1, (4, 4096))  # (rows, V): flat
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))  # (rows, V)
    golden = e / e.sum(axis=-1, keepdims=True)  # (rows, V)
    e16 = e.astype(np.float16)
    total = np.zeros((4, 1), dtype=np.float16)  # (rows, 1)
    for j in range(4096):
        total = (total + e16[:, j : j + 1]).astype(np.float16)  # each add rounded: stops at 2048
    assert float(total.max()) == 2048.0
    mutant = (e16 / total).astype(np.float16).astype(np.float64)  # (rows, V)
    named = _named(mutant, golden, "probs", "fp16", config, {})
    assert named and named[0].startswith(f"{SOFTMAX_ACCUMULATED} float16"), named
    assert "stops at 2048" in named[0]
    rng = np.random.default_rng(4)
    noisy = golden * (1 + rng.choice([-1.0, 1.0], golden.shape) * rng.uniform(0.3, 0.6, golden.shape))
    assert not any(c.startswith(SOFTMAX_ACCUMULATED) for c in _named(noisy, golden, "probs", "fp16", config, {}))


def test_logits_summed_in_bf16_are_named_and_a_random_error_is_not() -> None:
    d, V = 400, 32
    config = GPTConfig(vocab_size=V, n_ctx=4, d_model=d, n_layer=1, n_head=2, d_mlp=32, positions="learned")
    rng = np.random.default_rng(5)
    norm = rng.standard_normal((4, d)) * 0.01  # (T, d): the golden final LayerNorm, before its gain and bias
    g, beta = np.ones(d), np.ones(d)
    g[0], beta[0] = 0.0, 16.0
    wte = 0.003 * (1 + 0.25 * rng.random((V, d)))  # (V, d)
    wte[:, 0] = 0.125  # every logit starts with 16 x 0.125 = 2, then terms of ~0.003: under half a bf16 ulp of 2
    weights = {"ln_f.weight": g, "ln_f.bias": beta, "wte.weight": wte}
    golden = (norm * g + beta) @ wte.T  # (T, V)
    ln = round_to(norm * g + beta, "bf16")  # (T, d)
    w = round_to(wte, "bf16")  # (V, d)
    mutant = np.zeros((4, V))  # (T, V)
    for i in range(d):
        mutant = round_to(mutant + round_to(ln[:, i : i + 1] * w[:, i], "bf16"), "bf16")
    assert float(np.max(np.abs(mutant - golden))) > 0.25 * float(np.max(np.abs(golden)))  # past c = 32
    goldens = {"ln_final.hook_normalized": norm}
    named = _named(mutant.astype(np.float32), golden, "logits", "bf16", config, goldens, weights)
    assert named and named[0].startswith(f"{LOGITS_ACCUMULATED} bfloat16"), named
    off = golden * (1 + rng.choice([-1.0, 1.0], golden.shape) * rng.uniform(0.3, 0.6, golden.shape))
    assert not any(c.startswith(LOGITS_ACCUMULATED) for c in _named(off, golden, "logits", "bf16", config, goldens,
                                                                     weights))


def test_scores_whose_product_passes_65504_before_the_scale_are_named_in_fp16_only() -> None:
    config = GPTConfig(vocab_size=8, n_ctx=4, d_model=512, n_layer=1, n_head=2, d_mlp=32, positions="learned")
    rng = np.random.default_rng(6)
    scores = rng.standard_normal((2, 4, 4))  # (H, T, T): scaled by 1/sqrt(256) = 1/16
    scores[0, 1:, 0] = 4460.0  # a sink: q.k = 71,360 before the scale, past 65,504; the scaled score fits
    scores[np.broadcast_to(np.triu(np.ones((4, 4), dtype=bool), k=1), scores.shape)] = -np.inf
    tap = "blocks.0.attn.hook_attn_scores"
    mutant = scores.copy()
    mutant[0, 1:, 0] = np.inf  # the product in fp16: inf before the scale
    named = _named(mutant, scores, tap, "fp16", config, {})
    assert named and named[0].startswith(SCORES_PRODUCT_OVERFLOW) and "71360 > 65504" in named[0], named
    assert not any(c.startswith(SCORES_PRODUCT_OVERFLOW) for c in _named(mutant, scores, tap, "bf16", config, {}))
    small = scores.copy()
    small[0, 1:, 0] = 100.0  # a product of 1,600 fits: an inf there is another bug
    inf_small = small.copy()
    inf_small[0, 1:, 0] = np.inf
    assert not any(c.startswith(SCORES_PRODUCT_OVERFLOW) for c in _named(inf_small, small, tap, "fp16", config, {}))
    off = scores.copy()
    off[0, 1:, 0] = 4000.0  # finite and wrong: not an overflow
    assert not any(c.startswith(SCORES_PRODUCT_OVERFLOW) for c in _named(off, scores, tap, "fp16", config, {}))


@pytest.mark.full
def test_each_is_invisible_in_fp32_and_caught_in_its_precision_with_its_cause(tmp_path: Path) -> None:
    """`parity selftest --only` the four: it makes the fp16-stress fixture (seed 0) and runs each in fp32 and fp64
    (every comparison passes) and in its precision (caught at its tap, its cause named)."""
    out = tmp_path / "selftest.json"
    proc = run_cli("selftest", "-q", "--only", ",".join(EXPECTED), "--json", str(out), timeout=600)
    report = json.loads(out.read_text())
    assert report["fp16_stress_controls"] == {"reference": ""}, report["fp16_stress_controls"]
    rows = {r["name"]: r for r in report["mutants"]}
    assert set(rows) == set(EXPECTED)
    for name, (precision, tap, cause, likely) in EXPECTED.items():
        row = rows[name]
        assert row["caught_on"] == "fp16-stress" and row["precision"] == precision, row
        assert row["fp32_tiers"] == [] and not row["fp32_error"] and row["invisible_in_fp32"] is True, row
        assert row["caught"] and not row["error"], row
        assert row["tiers"] == [f"{precision}/fp32", f"{precision}/fp64"], row
        assert row["first_tap"] == tap and row["localized"], row
        assert row["cause"] == cause, row
        assert row["likely_cause"].startswith(likely), row
    assert report["totals"]["fp16_stress_caught_at_tap_invisible_in_fp32"] == len(EXPECTED)
    assert "fp16-stress mutants caught in their precision at their tap, invisible in fp32 and fp64: 4/4" in proc.stdout
    assert "control (reference, unpatched, fp16-stress, fp16/bf16/fp32/fp64): pass" in proc.stdout
    # --only four mutants: the whole catalog's rule of 3 fp64-only mutants is the only failure
    assert [w for w in report["failures"] if "fp64 tier alone" not in w] == [], report["failures"]
