"""Every caught mutant of `parity selftest` gets a `Likely cause:` naming its bug class (issue 37, item 3).

The mutant -> bug-class keyword table below is written once; the selftest's JSON (`likely_cause`) must
contain the keyword for each. A cause is never named where its pattern does not fit: an honest
backend's float32 round-off, and a random perturbation, get none.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity_harness._compare.diagnose import diagnose
from parity_harness._compare.patterns import TapContext
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._tools.mutants import CATALOG, by_name
from parity_harness._tools.selftest import run_selftest
from tests.helpers import REPO

# The bug class each mutant's cause must name (a substring of `likely_cause`).
CLASS: dict[str, str] = {
    "ts-no-causal-mask": "causal mask",
    "ts-mask-off-by-one": "causal mask",
    "ts-scale-sqrt-d-model": "attention scale",
    "ts-qk-swapped": "q and k swapped",
    "ts-heads-wrong-order": "heads split in the wrong order",
    "ts-ln-unbiased-variance": "variance over d - 1",
    "ts-gelu-tanh": "tanh GELU",
    "ts-erf-polynomial": "erf approximated",
    "ts-positions-float32": "float32",
    "ts-positions-shifted": "shifted position",
    "ts-float32-accumulation": "float32",
    "ts-final-ln-unused": "final LayerNorm not applied",
    "py-post-ln": "post-LN",
    "py-gelu-relu": "ReLU instead of GELU",
    "py-erf-polynomial": "erf approximated",
    "py-ln-eps": "LayerNorm eps",
    "py-no-conv1d-transpose": "Conv1D weight transposed",
    "py-softmax-wrong-axis": "softmax over the wrong axis",
    "py-untied-output": "untied output layer",
    "ts-decode-position-not-offset": "wrong position",
    "ts-decode-position-off-by-one": "wrong position",
    "ts-decode-cache-appended-after-use": "cache appended after use",
    "ts-decode-mask-single-query": "mask wrong at T = 1",
    "ts-decode-cache-transposed": "cache layout transposed",
    "py-decode-stale-cache": "stale cache",
    "py-decode-position-not-offset": "wrong position",
    "ts-softmax-no-max": "softmax overflow",
    "ts-ln-one-pass-variance": "E[x^2] - E[x]^2",
    "ts-additive-mask": "causal mask leaks",
    "ts-erf-series": "erf overflows",
    "py-softmax-no-max": "softmax overflow",
    "py-ln-one-pass-variance": "E[x^2] - E[x]^2",
    "py-additive-mask": "causal mask leaks",
    "py-erf-series": "erf overflows",
    "py-rp-softmax-fp16-sum": "softmax normalizer wrong",
    "py-rp-ln-var-fp16-sum": "overflow",
    "py-rp-gelu-bf16": "bfloat16 grid",
    "py-rp-kv-cache-fp16": "float16 grid",
    "py-fs-ln-one-pass-sum": "overflow in the LayerNorm's sum of squares",
    "py-fs-softmax-dtype-sum": "softmax sum accumulated in float16",
    "py-fs-logits-dtype-sum": "logits accumulated in bfloat16",
    "py-fs-scores-scaled-after": "overflow in q.k before the 1/sqrt(d_head) scale",
    "llama-rope-pairing": "RoPE pairing swapped",
    "llama-rope-base": "RoPE base",
    "llama-gqa-repeat": "grouped-query heads repeated",
    "llama-swiglu-swapped": "SwiGLU gate and up swapped",
    "llama-rms-eps": "RMSNorm eps",
    "llama-rms-one-plus-w": "RMSNorm weight applied as (1 + w)",
    "llama-np-rope-pairing": "RoPE pairing swapped",  # the same bugs in the NumPy Llama: the same classes
    "llama-np-rope-base": "RoPE base",
    "llama-np-gqa-repeat": "grouped-query heads repeated",
    "llama-np-swiglu-swapped": "SwiGLU gate and up swapped",
    "llama-np-rms-eps": "RMSNorm eps",
    "llama-np-rms-one-plus-w": "RMSNorm weight applied as (1 + w)",
}
# The two named bugs and a decoding one, in the fast set (the TypeScript port's runs take 0.3 s each);
# the whole catalog runs in the full set.
FAST = ["ts-ln-unbiased-variance", "ts-gelu-tanh", "ts-decode-position-off-by-one"]


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


def check_causes(rows: list[dict[str, object]]) -> None:
    for row in rows:
        name, cause = str(row["name"]), str(row["likely_cause"])
        assert row["caught"] and not row["error"], row
        assert CLASS[name] in cause, f"{name}: expected a cause naming {CLASS[name]!r}, got {cause!r}"


def test_the_table_covers_the_whole_catalog() -> None:
    assert set(CLASS) == {m.name for m in CATALOG}


def test_named_bugs_get_their_cause(toy: Fixture) -> None:
    result = run_selftest(toy, by_name(FAST))
    rows = result.to_json()["mutants"]
    assert isinstance(rows, list) and len(rows) == len(FAST)
    check_causes(rows)
    variance = next(r for r in rows if r["name"] == "ts-ln-unbiased-variance")
    assert "sqrt(d/(d-1)) = 1.0690" in variance["likely_cause"], variance


@pytest.mark.full
def test_every_caught_mutant_names_its_class(toy: Fixture) -> None:
    result = run_selftest(toy, list(CATALOG), stress=load_fixture(REPO / "fixtures" / "toy-stress"))
    rows = result.to_json()["mutants"]
    assert isinstance(rows, list) and len(rows) == len(CATALOG)
    check_causes(rows)


def _context(fx: Fixture, case: str, tap: str, goldens: dict[str, np.ndarray], precision: str) -> TapContext:
    return TapContext(tap, fx.config, goldens, {}, fx.weights(), precision)


def test_honest_float32_noise_gets_no_cause(toy: Fixture) -> None:
    """A float32 result: the float64 golden rounded to float32 plus a float32 ulp here and there, in the fp32 tier."""
    rng = np.random.default_rng(0)
    for case in toy.cases[:4]:
        goldens = toy.golden_case("fp64", case.name, toy.tap_names)
        for tap, golden in goldens.items():
            tol = toy.tolerances["fp32"].for_tap(tap)
            ulp = np.spacing(np.abs(golden).astype(np.float32)) * rng.integers(-2, 3, golden.shape)
            honest = (golden.astype(np.float32) + ulp.astype(np.float32)).astype(np.float32)
            honest[np.isinf(golden)] = golden[np.isinf(golden)]
            got = diagnose(honest, golden, "fp32", atol=tol.atol, rtol=tol.rtol,
                           context=_context(toy, case.name, tap, goldens, "fp32"))
            assert got == [], (case.name, tap, got)


@pytest.mark.parametrize("additive", [0.0, 1e-3])
def test_a_random_perturbation_gets_no_specific_cause(toy: Fixture, additive: float) -> None:
    """Each cell off by a random 0.1%..1%, either way (plus, or not, a random 1e-3): every tap fails, and no pattern
    claims it (multiplied only, probabilities stay probabilities and zeros stay zeros)."""
    rng = np.random.default_rng(1)
    for case in toy.cases[:4]:
        goldens = toy.golden_case("fp64", case.name, toy.tap_names)
        for tap, golden in goldens.items():
            tol = toy.tolerances["fp64"].for_tap(tap)
            factor = 1.0 + rng.choice([-1.0, 1.0], golden.shape) * rng.uniform(1e-3, 1e-2, golden.shape)
            with np.errstate(invalid="ignore"):
                perturbed = np.where(np.isfinite(golden),
                                     golden * factor + additive * rng.standard_normal(golden.shape), golden)
            got = diagnose(perturbed, golden, "fp64", atol=tol.atol, rtol=tol.rtol,
                           context=_context(toy, case.name, tap, goldens, "fp64"))
            assert got == [], (case.name, tap, got)
    # The same calls do name a pattern that fits: the scale of a variance over d - 1.
    goldens = toy.golden_case("fp64", toy.cases[0].name, toy.tap_names)
    tap, d, eps = "blocks.0.ln1.hook_scale", toy.config.d_model, toy.config.ln_eps
    unbiased = np.sqrt((goldens[tap] ** 2 - eps) * d / (d - 1) + eps)
    tol = toy.tolerances["fp64"].for_tap(tap)
    named = diagnose(unbiased, goldens[tap], "fp64", atol=tol.atol, rtol=tol.rtol,
                     context=_context(toy, toy.cases[0].name, tap, goldens, "fp64"))
    assert len(named) == 1 and named[0].startswith("LayerNorm variance over d - 1"), named
