"""The gradient judge (parity_harness/_compare/gradients.py) on the committed toy's goldens: backward order, the
first divergence nearest the loss, step-by-step training, and tolerances carried through AdamW."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from parity_harness._compare.gradients import (
    adamw_trajectory,
    backward_order,
    grad_tolerances,
    judge_backward,
    judge_training,
    train_order,
)
from parity_harness._compare.judge import FAIL, fold
from parity_harness._core.precision import Precision
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.training import golden_training
from parity_reference.training import step_key


@pytest.fixture(scope="module")
def toy(toy_dir: Path) -> Fixture:
    return load_fixture(toy_dir)


@pytest.fixture(scope="module")
def goldens(toy: Fixture) -> dict[str, tuple[dict, dict]]:  # type: ignore[type-arg]
    return {p: golden_training(toy, p) for p in ("fp32", "fp64")}


def _copy(x: dict) -> dict:  # type: ignore[type-arg]
    return copy.deepcopy({k: (v if not isinstance(v, dict) else {n: np.array(a) for n, a in v.items()})
                          for k, v in x.items()})


def test_backward_order_is_the_loss_then_the_taps_reversed_then_the_parameters(toy: Fixture) -> None:
    order = backward_order(toy)
    assert order[:3] == ["loss", "logits.grad", "ln_final.hook_normalized.grad"]
    taps = [t for t in toy.tap_names if t != "probs" and not t.startswith("logit_lens.")]
    assert order[1:1 + len(taps)] == [t + ".grad" for t in reversed(taps)]
    assert order[1 + len(taps):] == [p + ".grad" for p in reversed(list(toy.model.param_shapes()))]
    assert not any(n.startswith(("probs", "logit_lens")) for n in order)  # off the loss's path: no gradient


def test_the_magnitude_is_the_running_maximum_nearest_the_loss_first(toy: Fixture, goldens: dict) -> None:  # type: ignore[type-arg]
    tol = grad_tolerances(toy, *goldens["fp64"])
    names = backward_order(toy)[1:]
    ms = [tol.magnitude[n] for n in names]
    assert ms == sorted(ms) and ms[0] > 0  # never shrinks from the loss towards the embedding
    assert tol.atol("fp32", "logits.grad") == pytest.approx(64 * 2.0**-23 * tol.magnitude["logits.grad"])


def test_the_goldens_agree_with_each_other(toy: Fixture, goldens: dict) -> None:  # type: ignore[type-arg]
    """The float64 golden judged against the float32 one at the fp32 tier (a float64 result's "fp64 vs fp32"): the
    reference's own float32 round-off passes."""
    tol = grad_tolerances(toy, *goldens["fp64"])
    checks = judge_backward(toy, "ref", "fp64", "fp32", goldens["fp64"][0], goldens["fp32"][0], toy.grad_names(), tol)
    checks += judge_training(toy, "ref", "fp64", "fp32", goldens["fp64"][1], goldens["fp32"][1], tol)
    assert checks and all(c.passed for c in checks), [c for c in checks if not c.passed][:2]


def test_a_broken_gradient_is_the_first_divergence_and_what_is_nearer_the_loss_agrees(toy: Fixture,
                                                                                       goldens: dict) -> None:  # type: ignore[type-arg]
    grads, _ = goldens["fp64"]
    tol = grad_tolerances(toy, *goldens["fp64"])
    broken = _copy(grads)
    name = "blocks.1.hook_resid_mid.grad"
    for case in broken:  # a wrong adjoint there, and everything upstream of it wrong as a consequence
        broken[case][name] = broken[case][name] * 1.001
        broken[case]["hook_embed.grad"] = broken[case]["hook_embed.grad"] + 1e-3
    checks = judge_backward(toy, "b", "fp64", "fp64", broken, grads, toy.grad_names(), tol)
    _, divergences = fold(checks, backward_order(toy))
    assert [d.tap for d in divergences] == [name]
    before = backward_order(toy)[:backward_order(toy).index(name)]
    assert all(c.passed for c in checks if c.tap in before)


def test_a_parameter_gradient_alone_diverges_at_the_parameter(toy: Fixture, goldens: dict) -> None:  # type: ignore[type-arg]
    grads, _ = goldens["fp64"]
    tol = grad_tolerances(toy, *goldens["fp64"])
    broken = _copy(grads)
    for case in broken:  # the tied embedding's gradient from one use only: every tap's gradient still right
        broken[case]["wte.weight.grad"] = broken[case]["wte.weight.grad"] * 0.5
    checks = judge_backward(toy, "b", "fp64", "fp64", broken, grads, toy.grad_names(), tol)
    _, divergences = fold(checks, backward_order(toy))
    assert [d.tap for d in divergences] == ["wte.weight.grad"]


def test_the_training_step_is_judged_step_by_step(toy: Fixture, goldens: dict) -> None:  # type: ignore[type-arg]
    _, train = goldens["fp64"]
    tol = grad_tolerances(toy, *goldens["fp64"])
    broken = {k: np.array(v) for k, v in train.items()}
    for s in (2, 3):  # a schedule error from step 2 on
        broken[step_key(s, "h.0.mlp.c_fc.weight")] = broken[step_key(s, "h.0.mlp.c_fc.weight")] + 1e-4
    checks = judge_training(toy, "b", "fp64", "fp64", broken, train, tol)
    _, divergences = fold(checks, train_order(toy))
    assert [(d.step, d.tap) for d in divergences] == [(2, "h.0.mlp.c_fc.weight")]
    assert all(c.passed for c in checks if c.step == 1)


def test_adamw_bias_correction_off_by_one_fails_at_step_one(toy: Fixture, goldens: dict) -> None:  # type: ignore[type-arg]
    """The judge's AdamW reproduces the golden's; the same steps with t + 1 in the bias correction fail at step 1."""
    _, train = goldens["fp64"]
    spec = toy.training()
    assert spec is not None
    tol = grad_tolerances(toy, *goldens["fp64"])
    weights = toy.weights()
    shifted = {k: np.array(v) for k, v in train.items()}
    for name, p0 in weights.items():
        grads = [train[step_key(s, name + ".grad")] for s in range(1, spec.steps + 1)]
        ours = adamw_trajectory(p0, grads, spec, spec.decays(name))
        assert np.allclose(ours[-1], train[step_key(spec.steps, name)], rtol=0, atol=1e-13)
        b1, b2 = spec.betas
        p, m, v = p0.astype(np.float64), 0.0, 0.0
        for t, g in enumerate(grads, 1):  # the bug: bias corrections of step t + 1
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            p = p - spec.lr[t - 1] / (1 - b1 ** (t + 1)) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** (t + 1)) + spec.eps)
            shifted[step_key(t, name)] = p
    checks = judge_training(toy, "b", "fp64", "fp64", shifted, train, tol)
    first = min((c.step or 0) for c in checks if c.status == FAIL)
    assert first == 1


def test_a_zero_gradient_element_may_move_by_adamw_noise_in_fp32(toy: Fixture, goldens: dict) -> None:  # type: ignore[type-arg]
    """The key bias's gradient is zero: its fp32 update is rounding noise up to lr, and that passes in fp32; the same
    move where the gradient is large fails."""
    _, train64 = goldens["fp64"]
    tol = grad_tolerances(toy, *goldens["fp64"])
    d = toy.config.d_model
    key = step_key(1, "h.0.attn.c_attn.bias")
    g = train64[step_key(1, "h.0.attn.c_attn.bias.grad")]
    assert np.abs(g[d:2 * d]).max() < 1e-15  # the key part
    moved = {k: np.array(v, dtype=np.float32) for k, v in train64.items()}
    moved[key][d] += np.float32(0.5e-4)  # half of step 1's lr
    assert all(c.passed for c in judge_training(toy, "b", "fp32", "fp32", moved, goldens["fp32"][1], tol)
               if c.step == 1)
    big = int(np.argmax(np.abs(g)))
    moved[key][d] -= np.float32(0.5e-4)
    moved[key][big] += np.float32(0.5e-4)
    failed = [c for c in judge_training(toy, "b", "fp32", "fp32", moved, goldens["fp32"][1], tol) if not c.passed]
    assert [(c.step, c.tap) for c in failed][:1] == [(1, "h.0.attn.c_attn.bias")]


def _perturbed(train: dict, rng: np.random.Generator) -> list[dict]:  # type: ignore[type-arg]
    """The records as given, a few cells moved past their tolerance, a NaN, an infinity, and the other dtype."""
    params = [k for k in train if not k.endswith(".grad")]
    out = [dict(train)]
    moved, nan, inf, cast = (dict(train) for _ in range(4))
    for key in params:
        x = np.array(train[key])
        if x.size > 1:
            y = x.copy()
            y.flat[rng.integers(x.size, size=3)] += np.asarray(1e-3, dtype=x.dtype)
            moved[key] = y
            y = x.copy()
            y.flat[rng.integers(x.size)] = np.nan
            nan[key] = y
            y = x.copy()
            y.flat[0] = np.inf
            inf[key] = y
        cast[key] = x.astype(np.float32 if x.dtype == np.float64 else np.float64)
    return [*out, moved, nan, inf, cast]


def test_the_sliced_judge_and_allowances_are_the_whole_arrays(toy: Fixture, goldens: dict,  # type: ignore[type-arg]
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The training judge's slices (`_beyond`, allowances computed a CHUNK at a time) give every
    result the whole-array arithmetic gives, passing or failing, NaN and infinities and a wrong dtype included,
    with slices of 7 cells so that the toy's parameters span many; and every tier at once (`judge_training_tiers`,
    one pass of AdamW for a parameter's tiers) gives what one tier at a time gives."""
    import dataclasses

    from parity_harness._compare import gradients

    rng = np.random.default_rng(0)
    wanted = {}
    runs: list[tuple[Precision, list[Precision]]] = [("fp32", ["fp32"]), ("fp64", ["fp64", "fp32"])]
    for precision, tiers in runs:
        for i, output in enumerate(_perturbed(goldens[precision][1], rng)):
            monkeypatch.setattr(gradients, "_beyond", lambda *_: None)  # the whole-array path only
            tol = grad_tolerances(toy, *goldens["fp64"])
            wanted[(precision, i)] = [c for tier in tiers
                                      for c in judge_training(toy, "b", precision, tier, output, goldens[tier][1], tol)]
            monkeypatch.undo()
            monkeypatch.setattr(gradients, "CHUNK", 7)
            tol = grad_tolerances(toy, *goldens["fp64"])
            got = gradients.judge_training_tiers(toy, "b", precision, {t: goldens[t][1] for t in tiers}, output, tol)
            monkeypatch.undo()
            assert [repr(dataclasses.asdict(c)) for c in got] == [repr(dataclasses.asdict(c))
                                                                  for c in wanted[(precision, i)]], (precision, i)
    assert all(c.passed for c in wanted[("fp64", 0)]) and not all(c.passed for c in wanted[("fp64", 1)])
    assert any("NaN" in c.message for c in wanted[("fp32", 2)])
    whole = dict(grad_tolerances(toy, *goldens["fp64"]).allowance)  # computed now, in slices of CHUNK
    monkeypatch.setattr(gradients, "CHUNK", 7)
    sliced = grad_tolerances(toy, *goldens["fp64"]).allowance
    for key, a in whole.items():
        assert np.asarray(a).tobytes() == np.asarray(sliced[key]).tobytes(), key
