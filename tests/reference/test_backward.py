"""The gradient goldens against an independent float64 computation: central finite differences of the loss.

For every parameter of the toy and of toy-llama, the float64 golden gradient of a case's loss, dotted with a random
unit direction, against the loss's directional derivative by central differences with Richardson extrapolation (error
O(h^4)), in units of the loss, computed with the NumPy forward (parity_reference/numpy_model.py, llama_numpy.py: no
autograd, no torch). The tap gradients' independent check is the JAX backend's autodiff (tests/backends).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity_harness._fixture.fixture import Fixture, load_fixture
from parity_harness._fixture.training import golden_training
from parity_reference.families import family_of
from parity_reference.training import cross_entropy_sum


def _loss(fixture: Fixture, params: dict[str, np.ndarray], tokens: list[int]) -> float:
    forward = family_of(fixture.model.config).module("numpy").forward
    logits = forward(params, fixture.model.config, tokens)["logits"]  # (T, V)
    return cross_entropy_sum(logits, tokens) / (len(tokens) - 1)


@pytest.mark.parametrize("name", ["toy", "toy-llama"])
def test_every_parameter_gradient_agrees_with_finite_differences(toy_dir: Path, name: str) -> None:
    fixture = load_fixture(toy_dir.parent / name)
    spec = fixture.training()
    assert spec is not None
    grads, _ = golden_training(fixture, "fp64")
    weights = {k: v.astype(np.float64) for k, v in fixture.weights().items()}
    rng = np.random.default_rng(0)
    worst = 0.0
    for case in spec.cases[:3]:
        tokens = list(fixture.case(case).tokens)
        for param, value in weights.items():
            direction = rng.standard_normal(value.shape)  # a random unit direction in this parameter's space
            direction /= np.linalg.norm(direction)
            golden = float(np.sum(grads[case][param + ".grad"] * direction))

            def along(t: float, param: str = param, value: np.ndarray = value, direction: np.ndarray = direction,
                      tokens: list[int] = tokens) -> float:
                return _loss(fixture, {**weights, param: value + t * direction}, tokens)

            h = 1e-3
            d1 = (along(h) - along(-h)) / (2 * h)
            d2 = (along(h / 2) - along(-h / 2)) / h
            fd = (4 * d2 - d1) / 3  # Richardson: the h^2 term cancels
            worst = max(worst, abs(fd - golden) / max(1.0, abs(along(0.0))))
    # Finite differences' own accuracy at h = 1e-3 bounds the check: rounding eps * |L| / h ~ 5e-13 of the loss,
    # truncation O(h^4) after Richardson (measured worst: 8.8e-13 on the toy, 6.4e-13 on toy-llama, per unit of loss).
    assert worst < 1e-10, worst
