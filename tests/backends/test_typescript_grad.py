"""The typescript backend's backward and training step (ts_model/model/backward.ts on Node, float64) against torch
autograd (`parity_reference.backward.case_gradients` / `train_steps`, float64) on fixtures/toy and toy-stress.

Every loss, gradient and training record must agree to TIGHT (1e-12) of its tensor's largest value, or, where the
reference itself moves more than that under round-off, to SPREAD_K times that movement: the reference is run again
from its weights with each value moved by one ulp (x (1 +- 2^-52), SAMPLES seeded draws), and a tensor's spread is
the largest change of any draw over its largest value. A wrong adjoint is off by O(1); round-off is not. Two
places need the spread, both measured here:
- toy-stress: near-saturated attention makes the attention taps' gradients ill-conditioned (a one-ulp change of
  the weights moves blocks.1.attn.hook_q.grad by up to ~7e-9 of its max in torch itself);
- the key bias in training: its gradient is 0 in exact arithmetic (a shift of every key by one vector shifts a
  query's scores by a constant, which softmax ignores), so both sides hold round-off there, and AdamW divides
  that noise by sqrt(v_hat) + eps ~ eps: each step moves the key bias by ~lr * noise / eps (~1e-13 on the toy).

The spec is each fixture's own (its manifest's `training` section). Beside these direct comparisons, the harness's
own judge (`parity run --grad`, parity_harness/_run/grad_check.py) runs the backend on the toy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from parity_harness._backends.node.runtime import find_node
from parity_harness._backends.node.typescript_backend import TypeScriptBackend
from parity_harness._core.errors import BackendFailed, BackendUnavailable
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.training import grad_shape, train_shape
from parity_reference.backward import case_gradients, lesson_spec, train_steps
from parity_reference.training import TrainingSpec, train_names
from tests.helpers import REPO

TIGHT = 1e-12  # fp64: relative to each tensor's largest |value|
SPREAD_K = 4.0  # times the reference's own movement under one-ulp changes of its weights (measured worst: 1.4)
SAMPLES = 3

FIXTURES = ["toy", pytest.param("toy-stress", marks=pytest.mark.full)]


@pytest.fixture(autouse=True)
def node_available() -> None:
    try:
        find_node()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=FIXTURES)
def trained(request: pytest.FixtureRequest) -> tuple[Fixture, TrainingSpec]:
    fixture = load_fixture(REPO / "fixtures" / request.param)
    spec = fixture.training()
    assert spec is not None, f"{request.param} has no training section"
    return fixture, spec


def weights(fixture: Fixture) -> dict[str, np.ndarray]:
    """The fixture's float32 weights upcast to float64, as the fp64 tier computes from them."""
    from parity_harness._fixture.files import read_safetensors

    return {k: v.astype(np.float64) for k, v in read_safetensors(fixture.root / fixture.files["weights"]).items()}


def scale_of(x: np.ndarray) -> float:
    m = float(np.abs(x).max()) if x.size else 0.0
    return m if m > 0 else 1.0


def with_spread(run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]], w: Mapping[str, np.ndarray]
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The reference's result from `w`, and each tensor's spread: its largest change over SAMPLES runs from `w` with
    every value moved by one ulp either way, over its largest value."""
    ref = run(w)
    rng = np.random.default_rng(39)
    spread = dict.fromkeys(ref, 0.0)
    for _ in range(SAMPLES):
        ulp = np.finfo(np.float64).eps
        moved = run({k: v * (1 + ulp * rng.choice([-1.0, 1.0], size=v.shape)) for k, v in w.items()})
        for k, v in ref.items():
            spread[k] = max(spread[k], float(np.abs(moved[k] - v).max()) / scale_of(v))
    return ref, spread


def check(got: np.ndarray, ref: np.ndarray, spread: float, where: str) -> tuple[float, float]:
    """`got` within max(TIGHT, SPREAD_K * spread) of `ref`, relative to ref's max; (its error, that tolerance)."""
    err = float(np.abs(got - ref).max()) / scale_of(ref) if ref.size else 0.0
    tol = max(TIGHT, SPREAD_K * spread)
    assert err <= tol, f"{where}: {err:.2e} of its max > {tol:.2e} (reference spread {spread:.2e})"
    return err, tol


def test_grad_matches_autograd_in_fp64(trained: tuple[Fixture, TrainingSpec]) -> None:
    fixture, spec = trained
    got = TypeScriptBackend().grad(fixture, "fp64")
    assert list(got) == list(spec.cases)
    w, config = weights(fixture), fixture.model.config
    worst = (0.0, 0.0, "")
    for case in spec.cases:
        tokens = fixture.case(case).tokens
        want, spread = with_spread(lambda ws, t=tokens: case_gradients(ws, config, t, "fp64"), w)  # type: ignore[misc]
        assert list(got[case]) == ["loss", *fixture.grad_names()]  # backward order
        for name, ref in want.items():
            value = got[case][name]
            assert value.dtype == np.float64 and value.shape == grad_shape(fixture, name, len(tokens)), name
            err, tol = check(value, ref, spread[name], f"{case}/{name}")
            worst = max(worst, (err, tol, f"{case}/{name}"))
    print(f"worst gradient: {worst[0]:.2e} of its max, tolerance {worst[1]:.2e} ({worst[2]})")


def test_train_matches_autograd_in_fp64(trained: tuple[Fixture, TrainingSpec]) -> None:
    fixture, spec = trained
    got = TypeScriptBackend().train(fixture, "fp64")
    w, config = weights(fixture), fixture.model.config
    batch = [fixture.case(c).tokens for c in spec.cases]
    want, spread = with_spread(lambda ws: train_steps(ws, config, batch, spec, "fp64"), w)
    assert list(got) == train_names(spec, list(fixture.model.param_shapes())) and set(got) == set(want)
    worst = (0.0, 0.0, "")
    for key, ref in want.items():
        value = got[key]
        assert value.dtype == np.float64 and value.shape == train_shape(fixture, key), key
        err, tol = check(value, ref, spread[key], key)
        worst = max(worst, (err, tol, key))
    print(f"worst training record: {worst[0]:.2e} of its max, tolerance {worst[1]:.2e} ({worst[2]})")


def test_grad_and_train_cover_the_gpt2_family_in_fp64_only() -> None:
    backend = TypeScriptBackend()
    toy = load_fixture(REPO / "fixtures" / "toy")
    assert backend.supports_grad(toy) and backend.supports_training(toy)
    assert not backend.supports_grad(load_fixture(REPO / "fixtures" / "toy-llama"))  # model.ts is GPT-2 only
    with pytest.raises(BackendFailed, match="float64 only"):
        backend.grad(toy, "fp32")
    with pytest.raises(BackendFailed, match="float64 only"):
        backend.train(toy, "fp32")


def test_the_harness_judge_passes_it_on_the_toy() -> None:
    from parity_harness._run.grad_check import run_gradients

    report = run_gradients(load_fixture(REPO / "fixtures" / "toy"), [TypeScriptBackend()], ["fp64"])
    assert report.available and not report.not_supported and not report.not_training
    assert report.n_failed == 0 and report.n_passed > 0
    assert {(c.golden, c.case == "train") for c in (*report.checks, *report.train_checks)} == {
        (tier, train) for tier in ("fp32", "fp64") for train in (False, True)}  # both tiers, backward and steps


def test_a_one_token_training_case_is_one_line_from_node(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = lesson_spec(["grammar_0", "single_token"])  # the harness's parser refuses it; run-grad.ts does too
    monkeypatch.setattr(Fixture, "training", lambda self: spec)
    with pytest.raises(BackendFailed) as info:
        TypeScriptBackend().grad(load_fixture(REPO / "fixtures" / "toy"), "fp64")
    message = str(info.value)
    assert "\n" not in message and "single_token" in message and "one token" in message, message
