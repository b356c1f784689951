"""The Llama family's hand-written NumPy backward (parity_reference/llama_numpy_backward.py) against torch autograd.

Every gradient and the loss of every training case of toy-llama in fp64 and fp32 (parity_reference/backward.py's
case_gradients); what toy-llama does not exercise (a tied head, Meta's interleaved RoPE pairs, attention biases,
one key/value head, as many as query heads) on random weights; the numpy backend's `grad` and `train` against
the committed gradient goldens; and a RoPE backward that turns the wrong way, caught where it first shows.
Errors are in units of each gradient's magnitude M (tests/helpers.py's `grad_errors`).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import numpy as np
import pytest

from parity_harness._backends.numpy_backend import NumpyBackend
from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.training import golden_training
from parity_reference import llama_numpy_backward as lb
from parity_reference.backward import case_gradients, lesson_spec, train_steps
from parity_reference.llama_config import TOY_LLAMA, LlamaConfig, param_shapes
from parity_reference.training import backward_names, step_key
from tests.helpers import REPO, first_over, grad_errors

DTYPE: dict[str, type[np.floating[Any]]] = {"fp32": np.float32, "fp64": np.float64}
BOUND = {"fp64": 1e-12, "fp32": 1e-5}  # measured: 9.2e-16 and 5.3e-7 x M (docs/training-port.md)


@cache
def _fixture() -> Fixture:
    return load_fixture(REPO / "fixtures" / "toy-llama")


def _config(fixture: Fixture) -> LlamaConfig:
    config = fixture.model.config
    assert isinstance(config, LlamaConfig)
    return config


def _compare(weights: dict[str, np.ndarray], config: LlamaConfig, cases: dict[str, list[int]],
             precision: str) -> dict[str, float]:
    """Every case's loss and gradients, by hand and by autograd: grad_errors in backward order."""
    params = {name: w.astype(DTYPE[precision]) for name, w in weights.items()}
    got, want = {}, {}
    for name, tokens in cases.items():
        loss, grads = lb.backward(params, config, tokens)
        got[name] = {"loss": loss, **grads}
        want[name] = case_gradients(weights, config, tokens, precision)
    return grad_errors(got, want, order=list(next(iter(got.values()))))


def _cases(fixture: Fixture) -> dict[str, list[int]]:
    return {c.name: list(c.tokens) for c in fixture.cases if len(c.tokens) >= 2}


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_every_gradient_of_every_case_matches_autograd(precision: str) -> None:
    fixture = _fixture()
    config = _config(fixture)
    errors = _compare(fixture.weights(), config, _cases(fixture), precision)
    assert list(errors) == ["loss", *backward_names(fixture.tap_names, list(param_shapes(config)))]
    first, worst, where = first_over(errors, BOUND[precision])
    assert first is None, f"{precision}: {first} is {errors[first]:.3g} x M (worst {worst:.3g} at {where})"


def _random_weights(config: LlamaConfig, seed: int = 3) -> dict[str, np.ndarray]:
    """N(0, 0.3) everywhere, the norms' gains around 1: larger than an initialization, so every path matters."""
    rng = np.random.default_rng(seed)
    return {n: (rng.normal(0.0, 0.3, s) + (1.0 if "norm" in n else 0.0)).astype(np.float32)
            for n, s in param_shapes(config).items()}


VARIANTS = {
    "tied": {"tied": True},
    "interleaved": {"rope_pairing": "interleaved"},
    "bias": {"bias": True},
    "one-kv-head-tied-bias": {"n_kv_heads": 1, "bias": True, "tied": True},
    "kv-heads-as-query-heads-interleaved": {"n_kv_heads": 4, "rope_pairing": "interleaved"},
}


@pytest.mark.parametrize("change", list(VARIANTS.values()), ids=list(VARIANTS))
def test_other_configs_match_autograd(change: dict[str, object]) -> None:
    config = dataclasses.replace(TOY_LLAMA, **change)  # type: ignore[arg-type]
    cases = {"a": [0, 3, 5, 3, 7, 1, 11, 2, 3], "b": [4, 4], "c": [*range(12), 0, 1, 2, 3]}
    errors = _compare(_random_weights(config), config, cases, "fp64")
    first, worst, where = first_over(errors, BOUND["fp64"])
    assert first is None, f"{change}: {first} is {errors[first]:.3g} x M (worst {worst:.3g} at {where})"


def test_parameter_gradients_agree_with_finite_differences() -> None:
    """An independent float64 check, without torch: along random directions v of every parameter at once, the
    directional derivative <grad, v> against Richardson-extrapolated central differences of the loss. Measured on
    toy-llama: 3.6e-10 relative at h = 1e-4."""
    from parity_reference import llama_numpy

    fixture = _fixture()
    config = _config(fixture)
    params = {name: w.astype(np.float64) for name, w in fixture.weights().items()}
    tokens = list(fixture.case("grammar_3").tokens)
    _, grads = lb.backward(params, config, tokens)
    rng = np.random.default_rng(0)
    for _ in range(3):
        v = {k: rng.normal(size=p.shape) for k, p in params.items()}

        def loss(h: float, v: dict[str, np.ndarray] = v) -> float:
            moved = {k: params[k] + h * v[k] for k in params}
            logits = llama_numpy.forward(moved, config, tokens, lens_rows=1)["logits"]  # (T, V)
            return float(lb.cross_entropy_backward(logits, tokens)[0])

        def central(h: float) -> float:
            return (loss(h) - loss(-h)) / (2 * h)

        numeric = (4 * central(5e-5) - central(1e-4)) / 3
        analytic = sum(float((grads[k + ".grad"] * v[k]).sum()) for k in params)
        assert abs(numeric - analytic) <= 1e-8 * abs(analytic), (numeric, analytic)


def _rope_backward_turning_forward(dout: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                                   pairing: str) -> np.ndarray:
    """A port bug: RoPE's backward turning by the angle again, not by minus it (the forward rotation reused)."""
    from parity_reference.llama_numpy import apply_rope

    return apply_rope(dout, cos, sin, pairing)  # (T, heads, dh)


def test_a_rope_backward_turning_the_wrong_way_is_caught_where_it_first_shows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught at the last block's key before RoPE (hook_k: the taps run q, k, v, rot_q, rot_k, so backward order
    meets it first), the first gradient it changes; the rotated query and key (hook_rot_q, hook_rot_k) stay right,
    and the query before RoPE is wrong too."""
    fixture = _fixture()
    monkeypatch.setattr(lb, "rope_backward", _rope_backward_turning_forward)
    errors = _compare(fixture.weights(), _config(fixture), _cases(fixture), "fp64")
    first, worst, _ = first_over(errors, BOUND["fp64"])
    last = _config(fixture).n_layer - 1
    assert first == f"blocks.{last}.attn.hook_k.grad"
    assert worst > 1e-3 and errors[f"blocks.{last}.attn.hook_q.grad"] > 1e-3
    assert errors[f"blocks.{last}.attn.hook_rot_q.grad"] <= BOUND["fp64"]
    assert errors[f"blocks.{last}.attn.hook_rot_k.grad"] <= BOUND["fp64"]


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_numpy_backend_grad_and_train_match_the_goldens(precision: str) -> None:
    """The backend's `grad` and `train` against toy-llama's committed gradient goldens (weight decay 0.1 outside
    the norms' gains): every gradient, and every training record relative to its own max."""
    fixture = _fixture()
    spec = fixture.training()
    assert spec is not None
    backend = NumpyBackend()
    assert backend.supports_grad(fixture) and backend.supports_training(fixture)
    grads, records = golden_training(fixture, precision)  # type: ignore[arg-type]
    out = backend.grad(fixture, precision)  # type: ignore[arg-type]
    errors = grad_errors(out, {c: dict(g) for c, g in grads.items()}, order=["loss", *fixture.grad_names()])
    assert list(errors) == ["loss", *fixture.grad_names()]
    first, worst, where = first_over(errors, BOUND[precision])
    assert first is None, f"{first}: {errors[first]:.3g} x M (worst {worst:.3g} at {where})"
    trained = backend.train(fixture, precision)  # type: ignore[arg-type]
    params = list(param_shapes(_config(fixture)))
    assert list(trained) == [step_key(s, n) for s in range(1, spec.steps + 1) for n in ("loss", "grad_norm", *params)]
    want = {k: v for k, v in records.items() if k in trained}  # the golden also holds each step's batch gradient
    errors = grad_errors({"": trained}, {"": want})
    first, worst, where = first_over(errors, BOUND[precision])
    assert first is None, f"{first}: {errors[first]:.3g} of its max (worst {worst:.3g} at {where})"


@pytest.mark.full  # torch's optimizer (its first step imports much of torch)
def test_tied_training_steps_match_torch_adamw() -> None:
    """A tied head trains (the embedding's gradient from both uses, every step), fp64, with weight decay."""
    config = dataclasses.replace(TOY_LLAMA, tied=True, bias=True)
    weights = _random_weights(config)
    batch = [[0, 3, 5, 3, 7, 1, 11, 2, 3], [4, 4], [*range(12), 0, 1, 2, 3]]
    spec = lesson_spec(["a", "b", "c"], weight_decay=0.1, no_decay=[n for n in weights if "norm" in n])
    got = lb.train({k: w.astype(np.float64) for k, w in weights.items()}, config, batch, spec, family=lb)
    errors = grad_errors({"": got}, {"": train_steps(weights, config, batch, spec, "fp64")})
    first, worst, where = first_over(errors, BOUND["fp64"])
    assert first is None, f"{first}: {errors[first]:.3g} of its max (worst {worst:.3g} at {where})"
