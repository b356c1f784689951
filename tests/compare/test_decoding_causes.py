"""Causes for decoding first divergences (issue 37, item 3): `diagnose_step` and the decoding check's `cause`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity_harness._compare.diagnose import diagnose_step
from parity_harness._compare.patterns import StepContext
from parity_harness._fixture.decoding import golden_decoding, step_key
from parity_harness._fixture.fixture import Fixture, load_fixture

TAP = "blocks.0.attn.cache_k"


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


def step_context(toy: Fixture, step: int) -> tuple[StepContext, dict[str, np.ndarray]]:
    decoding = toy.decoding()
    assert decoding is not None
    prompt = decoding.prompts[0]
    golden = golden_decoding(toy, "fp64")[prompt.name]
    previous = {t: golden[step_key(step - 1, t)] for t in decoding.taps}
    now = {t: golden[step_key(step, t)] for t in decoding.taps}
    return StepContext(toy.config, toy.weights(), prompt.generated[step - 1], len(prompt.tokens) + step - 1, previous,
                       "fp64"), now


def test_a_stale_cache_is_named(toy: Fixture) -> None:
    ctx, now = step_context(toy, 1)
    got = diagnose_step(ctx.previous[TAP], now[TAP], TAP, 1, atol=1e-12, context=ctx)
    assert got == ["stale cache: step 1's cache_k is step 0's (not updated)"]


def test_a_transposed_cache_is_named(toy: Fixture) -> None:
    _, now = step_context(toy, 1)
    golden = now[TAP]
    stored = golden.transpose(1, 0, 2).reshape(golden.shape)  # [T, H, dh] in memory, read as [H, T, dh]
    (got,) = diagnose_step(stored, golden, TAP, 1, atol=1e-12)
    assert got.startswith("cache layout transposed")


@pytest.mark.parametrize("offset", [-1, 1])
def test_the_new_token_at_a_neighbouring_position_is_named(toy: Fixture, offset: int) -> None:
    from parity_harness._compare.gpt2_causes import step_replay as _one_step

    ctx, now = step_context(toy, 1)
    shifted = _one_step(ctx, ctx.position + offset, "all")[TAP]
    (got,) = diagnose_step(shifted, now[TAP], TAP, 1, atol=1e-12, context=ctx)
    assert got.startswith("the new token at a wrong position") and f"(offset {offset:+d}" in got, got


def test_an_honest_step_recomputed_agrees_and_noise_gets_no_cause(toy: Fixture) -> None:
    from parity_harness._compare.gpt2_causes import step_replay as _one_step

    ctx, now = step_context(toy, 2)
    honest = _one_step(ctx, ctx.position, "all")
    for tap, golden in now.items():  # the recomputation is the golden's own step
        assert np.allclose(honest[tap], golden, atol=1e-12, rtol=0), tap
    rng = np.random.default_rng(0)
    for tap, golden in now.items():
        noisy = golden * (1 + rng.uniform(1e-3, 1e-2, golden.shape)) + 1e-3 * rng.standard_normal(golden.shape)
        assert diagnose_step(noisy, golden, tap, 2, atol=1e-12, context=ctx) == [], tap
