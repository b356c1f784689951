"""The hand-written NumPy backward (parity_reference/numpy_backward.py) against torch autograd (backward.py).

Every gradient and the loss of every training case of toy and toy-stress, in fp64 and fp32; the training steps
(AdamW) against `train_steps`; other configs (gelu_new, learned positions, no mask); the numpy backend's `grad`
and `train`; and a deliberately broken LayerNorm backward, caught where it first shows.

Errors are in units of each gradient's magnitude M (max over cases of |reference|; tests/helpers.py's
`grad_errors`, the gradient judge's M). Measured (docs/training-port.md): toy fp64 1.1e-14, fp32 3.2e-6;
toy-stress fp64 4.2e-10, whose forward already disagrees with torch's at 5e-12 (its attention is saturated on
purpose), so its bound is wider.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._core.errors import BackendFailed, FixtureError
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.training import golden_training
from parity_reference import numpy_backward as nb
from parity_reference import numpy_model as nm
from parity_reference.backward import case_gradients, lesson_spec, train_steps
from parity_reference.config import TOY, GPTConfig, param_shapes
from parity_reference.training import TrainingSpec, adam_bound, backward_names, step_key
from tests.helpers import REPO, edit_manifest, first_over, grad_errors

DTYPE: dict[str, type[np.floating[Any]]] = {"fp32": np.float32, "fp64": np.float64}
# The bound per fixture and tier, in units of M. toy-stress fp64: its forward differs from torch's by 5e-12 x M
# (hook_pattern), and the backward's conditioning grows that to 4.2e-10 (ln1's scale, attention keys).
BOUND = {("toy", "fp64"): 1e-12, ("toy", "fp32"): 1e-5, ("toy-stress", "fp64"): 2e-9}


@cache
def _fixture(name: str) -> Fixture:
    return load_fixture(REPO / "fixtures" / name)


def _config(fixture: Fixture) -> GPTConfig:
    config = fixture.model.config
    assert isinstance(config, GPTConfig)
    return config


def _training_cases(fixture: Fixture) -> list[str]:
    return [c.name for c in fixture.cases if len(c.tokens) >= 2]


def _cast(weights: dict[str, np.ndarray], precision: str) -> dict[str, np.ndarray]:
    return {name: w.astype(DTYPE[precision]) for name, w in weights.items()}


def _order(config: GPTConfig, tap_names: list[str]) -> list[str]:
    return ["loss", *backward_names(tap_names, list(param_shapes(config)))]


def _compare(weights: dict[str, np.ndarray], config: GPTConfig, cases: dict[str, list[int]],
             precision: str) -> dict[str, float]:
    """Every case's loss and gradients, by hand and by autograd: grad_errors in backward order."""
    params = _cast(weights, precision)
    got, want = {}, {}
    for name, tokens in cases.items():
        loss, grads = nb.backward(params, config, tokens)
        got[name] = {"loss": loss, **grads}
        want[name] = case_gradients(weights, config, tokens, precision)
    return grad_errors(got, want, order=list(next(iter(got.values()))))


@pytest.mark.parametrize(("name", "precision"), sorted(BOUND))
def test_every_gradient_of_every_case_matches_autograd(name: str, precision: str) -> None:
    fixture = _fixture(name)
    cases = {c: list(fixture.case(c).tokens) for c in _training_cases(fixture)}
    errors = _compare(fixture.weights(), _config(fixture), cases, precision)
    assert list(errors) == _order(_config(fixture), fixture.tap_names)  # every gradient, in backward order
    first, worst, where = first_over(errors, BOUND[name, precision])
    assert first is None, f"{name} {precision}: {first} is {errors[first]:.3g} x M (worst {worst:.3g} at {where})"


@pytest.mark.parametrize("change", [{"activation": "gelu_new"}, {"positions": "learned"}, {"causal": False},
                                    {"n_head": 4, "n_layer": 3, "activation": "gelu_new", "positions": "learned"}],
                         ids=["gelu_new", "learned", "unmasked", "4-heads-3-layers"])
def test_other_configs_match_autograd(change: dict[str, object]) -> None:
    """What the committed fixtures do not exercise: GPT-2's tanh GELU, learned positions (wpe's gradient, rows
    past T zero), the unmasked model; random weights of a larger scale than the toy's."""
    config = dataclasses.replace(TOY, **change)  # type: ignore[arg-type]
    rng = np.random.default_rng(7)
    weights = {n: (rng.normal(0.0, 0.3, s) + (1.0 if "ln_" in n and n.endswith(".weight") else 0.0)).astype(np.float32)
               for n, s in param_shapes(config).items()}  # LayerNorm gains near 1
    cases = {"a": [0, 3, 5, 3, 7, 1, 11, 2, 3], "b": [4, 4], "c": [*range(12), 0, 1, 2, 3]}
    errors = _compare(weights, config, cases, "fp64")
    first, worst, where = first_over(errors, 1e-12)
    assert first is None, f"{change}: {first} is {errors[first]:.3g} x M (worst {worst:.3g} at {where})"


def test_parameter_gradients_agree_with_finite_differences() -> None:
    """An independent float64 check, without torch: along random directions v of every parameter at once, the
    directional derivative <grad, v> against central differences of the loss, Richardson-extrapolated
    ((4 D(h/2) - D(h)) / 3, error O(h^4)). Measured on the toy: 4.3e-12 relative at h = 1e-4."""
    fixture = _fixture("toy")
    config, params = _config(fixture), _cast(fixture.weights(), "fp64")
    tokens = list(fixture.case("grammar_3").tokens)
    _, grads = nb.backward(params, config, tokens)
    rng = np.random.default_rng(0)
    for _ in range(3):
        v = {k: rng.normal(size=p.shape) for k, p in params.items()}

        def loss(h: float, v: dict[str, np.ndarray] = v) -> float:
            moved = {k: params[k] + h * v[k] for k in params}
            return float(nb.cross_entropy_backward(nm.forward(moved, config, tokens, lens_rows=1)["logits"], tokens)[0])

        def central(h: float) -> float:
            return (loss(h) - loss(-h)) / (2 * h)

        numeric = (4 * central(5e-5) - central(1e-4)) / 3
        analytic = sum(float((grads[k + ".grad"] * v[k]).sum()) for k in params)
        assert abs(numeric - analytic) <= 1e-9 * abs(analytic), (numeric, analytic)


def _broken_layer_norm_backward(dout: np.ndarray, weight: np.ndarray, scale: np.ndarray,
                                normalized: np.ndarray) -> tuple[np.ndarray, ...]:
    """The classic port bug: LayerNorm's backward without the mean's term (dx = (dn - n mean(dn n)) / s)."""
    dn = dout * weight  # (T, d)
    dn_n = dn * normalized  # (T, d)
    dx = (dn - normalized * dn_n.mean(axis=-1, keepdims=True)) / scale  # (T, d)
    return dx, (dout * normalized).sum(axis=0), dout.sum(axis=0), dn, -dn_n.sum(axis=-1, keepdims=True) / scale


def test_a_layer_norm_backward_without_the_mean_term_is_caught_where_it_first_shows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison catches the bug, at the first gradient it changes in backward order: the stream entering
    the final LayerNorm (the last block's resid_post); the final LayerNorm's own taps and gains stay right."""
    fixture = _fixture("toy")
    monkeypatch.setattr(nb, "layer_norm_backward", _broken_layer_norm_backward)
    cases = {c: list(fixture.case(c).tokens) for c in _training_cases(fixture)}
    errors = _compare(fixture.weights(), _config(fixture), cases, "fp64")
    first, worst, _ = first_over(errors, BOUND["toy", "fp64"])
    last = _config(fixture).n_layer - 1
    assert first == f"blocks.{last}.hook_resid_post.grad"
    assert worst > 1e-3  # not a rounding difference: the gradient is wrong
    for right in ("loss", "logits.grad", "ln_final.hook_normalized.grad", "ln_final.hook_scale.grad",
                  "ln_f.weight.grad", "ln_f.bias.grad"):
        assert errors[right] <= BOUND["toy", "fp64"], right


# -- the training step -----------------------------------------------------------------------------------


def _no_decay(config: GPTConfig) -> tuple[str, ...]:
    """GPT-2's usual exclusions: biases and LayerNorm gains."""
    return tuple(n for n in param_shapes(config) if n.endswith(".bias") or "ln_" in n)


def _key_bias_drift(spec: TrainingSpec, weights: dict[str, np.ndarray], config: GPTConfig,
                    batch: list[list[int]], precision: str) -> float:
    """How far AdamW can move the attention's key bias in `spec.steps` steps, though its gradient is 0 in exact
    arithmetic (a constant added to a row of scores): the rounding noise g, of order eps x the bias gradient's
    magnitude, moves it by lr |m_hat| / (sqrt(v_hat) + eps) <= lr |g| / eps per step (the noise differs between
    implementations, so does the drift)."""
    _, grads = nb.batch_backward(_cast(weights, precision), config, batch)
    magnitude = max(float(np.abs(grads[f"h.{i}.attn.c_attn.bias"]).max()) for i in range(config.n_layer))
    noise = 64 * float(np.finfo(DTYPE[precision]).eps) * magnitude
    return sum(lr * min(noise / spec.eps, adam_bound(spec, s)) for s, lr in enumerate(spec.lr, start=1))


def _split_key_bias(records: dict[str, np.ndarray], config: GPTConfig) -> dict[str, np.ndarray]:
    """c_attn.bias's query and value parts stay one record; its key part (columns d .. 2d) is set apart."""
    d, out = config.d_model, {}
    for name, value in records.items():
        if name.endswith("attn.c_attn.bias"):
            out[name] = np.concatenate([value[:d], value[2 * d:]])
            out[name + "[key]"] = value[d:2 * d]
        else:
            out[name] = value
    return out


def _check_training(got: dict[str, np.ndarray], want: dict[str, np.ndarray], fixture: Fixture, spec: TrainingSpec,
                    precision: str, bound: float) -> None:
    """Every record of `want` (the loss, the gradient norm, every parameter per step) relative to its own max,
    within `bound`; the key bias within the drift its rounding noise allows, in both."""
    config, weights = _config(fixture), fixture.weights()
    want = {k: v for k, v in want.items() if k in got}  # the golden also holds each step's batch gradient
    errors = grad_errors({"": _split_key_bias(got, config)}, {"": _split_key_bias(want, config)})
    tight = {n: e for n, e in errors.items() if not n.endswith("[key]")}
    first, worst, where = first_over(tight, bound)
    assert first is None, f"{precision}: {first} is {tight[first]:.3g} of its max (worst {worst:.3g} at {where})"
    batch = [list(fixture.case(c).tokens) for c in spec.cases]
    drift = _key_bias_drift(spec, weights, config, batch, precision)
    d = config.d_model
    for s in range(1, spec.steps + 1):
        for i in range(config.n_layer):
            key, start = step_key(s, f"h.{i}.attn.c_attn.bias"), weights[f"h.{i}.attn.c_attn.bias"][d:2 * d]
            for records in (got, want):
                moved = float(np.abs(records[key][d:2 * d].astype(np.float64) - start).max())
                assert moved <= drift, f"{key}: the key bias moved {moved:.3g}, more than its noise allows"


@pytest.mark.full  # torch's optimizer (its first step imports much of torch): the goldens are checked below
@pytest.mark.parametrize(("name", "decay"), [("toy", True), ("toy-stress", False)])
def test_training_steps_match_torch_adamw(name: str, decay: bool) -> None:
    """fp64 steps against torch.optim.AdamW run here (backward.train_steps): toy-stress's own spec (weight decay
    outside biases and gains), and the toy with the same kind of decay (its own spec has none)."""
    fixture = _fixture(name)
    config, weights = _config(fixture), fixture.weights()
    spec = fixture.training()
    assert spec is not None
    if decay:
        spec = lesson_spec(spec.cases, weight_decay=0.1, no_decay=_no_decay(config))
    batch = [list(fixture.case(c).tokens) for c in spec.cases]
    got = nb.train(_cast(weights, "fp64"), config, batch, spec)
    # toy-stress: the gradient norm carries its gradients' error (held to BOUND): measured 9.9e-12 of its value
    _check_training(got, train_steps(weights, config, batch, spec, "fp64"), fixture, spec, "fp64",
                    BOUND[name, "fp64"])


def test_weight_decay_applies_only_where_the_spec_says() -> None:
    """The decoupled decay alone: with a zero gradient (and zero moments) AdamW only decays, where told to."""
    spec = lesson_spec(["x"], steps=1, weight_decay=0.5)
    p = np.array([2.0, -4.0])  # (2,)
    zero = np.zeros(2)  # (2,)
    decayed, _, _ = nb.adamw_step(p, zero, zero, zero, 1, 0.1, spec, True)
    kept, _, _ = nb.adamw_step(p, zero, zero, zero, 1, 0.1, spec, False)
    assert np.array_equal(decayed, p * (1 - 0.1 * 0.5)) and np.array_equal(kept, p)


# -- the numpy backend -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "precision"), sorted(BOUND))
def test_numpy_backend_grad_and_train_match_the_goldens(name: str, precision: str) -> None:
    """The backend's `grad` and `train` against the fixture's committed gradient goldens (torch autograd and
    torch.optim.AdamW, golden.grad.*.safetensors): every gradient in backward order, every training record."""
    fixture = _fixture(name)
    spec = fixture.training()
    assert spec is not None
    backend = NumpyBackend()
    assert backend.supports_grad(fixture) and backend.supports_training(fixture)
    grads, records = golden_training(fixture, precision)  # type: ignore[arg-type]
    out = backend.grad(fixture, precision)  # type: ignore[arg-type]
    assert list(out) == list(spec.cases)
    errors = grad_errors(out, {c: dict(g) for c, g in grads.items()}, order=["loss", *fixture.grad_names()])
    assert list(errors) == ["loss", *fixture.grad_names()]
    first, worst, where = first_over(errors, BOUND[name, precision])
    assert first is None, f"{first}: {errors[first]:.3g} x M (worst {worst:.3g} at {where})"
    trained = backend.train(fixture, precision)  # type: ignore[arg-type]
    params = list(param_shapes(_config(fixture)))
    assert list(trained) == [step_key(s, n) for s in range(1, spec.steps + 1) for n in ("loss", "grad_norm", *params)]
    assert trained[step_key(1, "loss")].shape == () and trained[step_key(1, "grad_norm")].shape == ()
    _check_training(trained, dict(records), fixture, spec, precision, BOUND[name, precision])


def test_numpy_backend_refuses_fp16_and_a_fixture_without_training(fixture_copy: Path) -> None:
    with pytest.raises(BackendFailed, match="no backward in fp16"):
        NumpyBackend().grad(_fixture("toy"), "fp16")

    def drop_training(manifest: dict[str, Any]) -> None:
        del manifest["training"], manifest["files"]["training"]
        manifest["sha256"] = {k: v for k, v in manifest["sha256"].items() if "grad" not in k}

    edit_manifest(fixture_copy, drop_training)
    bare = load_fixture(fixture_copy)
    assert bare.training() is None
    with pytest.raises(FixtureError, match="no training section"):
        NumpyBackend().train(bare, "fp64")


def test_numpy_backend_checks_training_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = load_fixture(REPO / "fixtures" / "toy")
    spec = fixture.training()
    assert spec is not None
    case = dataclasses.replace(fixture.case(spec.cases[0]), tokens=(0, 99))
    monkeypatch.setattr(Fixture, "case", lambda self, name: case)  # a fixture is read-only: its class is not
    with pytest.raises(FixtureError, match=f"case '{case.name}': token id 99 out of range"):
        NumpyBackend().grad(fixture, "fp64")
