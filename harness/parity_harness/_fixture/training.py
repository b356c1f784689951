"""The gradient goldens: what a tier's file holds, read through the one checked reader.

A fixture with a `training` section (_fixture/training_section.py) has one file per tier holding
`cases/{case}/loss` (shape []) and `cases/{case}/{name}.grad` for every training case and every gradient
of `Fixture.grad_names()` (each case's own loss), then `train/step{s}/loss`, `train/step{s}/grad_norm` (shape
[]), `train/step{s}/{param}` for every step and parameter (parity_reference/training.py), and the judge's own
`train/step{s}/{param}.grad`, each step's batch gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import DTYPES, Precision
from parity_reference.tensor_check import TRAINING_GOLDEN, Expected
from parity_reference.training import GRAD_SUFFIX, step_key, train_names

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

GradOutput = dict[str, dict[str, np.ndarray]]  # {case: {"loss" | "{name}.grad": array}}
TrainOutput = dict[str, np.ndarray]  # {"step{s}/loss" | "step{s}/grad_norm" | "step{s}/{param}": array}
CASES, TRAIN = "cases/", "train/"


def grad_shape(fixture: Fixture, name: str, n_tokens: int) -> tuple[int, ...]:
    """The shape of gradient `name` ("{tap}.grad" or "{param}.grad") for a case of `n_tokens`; "loss" is []."""
    if name == "loss":
        return ()
    base = name.removesuffix(GRAD_SUFFIX)
    params = fixture.model.param_shapes()
    if base in params:
        return tuple(params[base])
    return tuple(n_tokens if s == "T" else int(s) for s in fixture.model.shape_template(base))


def train_shape(fixture: Fixture, key: str) -> tuple[int, ...]:
    name = key.split("/", 1)[1].removesuffix(GRAD_SUFFIX)
    return () if name in ("loss", "grad_norm") else tuple(fixture.model.param_shapes()[name])


def golden_train_names(fixture: Fixture) -> list[str]:
    """The golden's training keys: a backend's (`train_names`), then each step's batch gradient of every parameter,
    `step{s}/{param}.grad`, which only the judge reads."""
    spec = fixture.training()
    assert spec is not None
    params = list(fixture.model.param_shapes())
    return [*train_names(spec, params), *(step_key(s, p + GRAD_SUFFIX) for s in range(1, spec.steps + 1)
                                          for p in params)]


def training_table(fixture: Fixture, precision: Precision) -> dict[str, Expected]:
    """What a tier's gradient golden file holds: {key: its dtype and shape}; FixtureError without a section."""
    spec = fixture.training()
    if spec is None:
        raise FixtureError(f"{fixture.manifest_path}: the fixture has no training section (no gradient goldens)")
    dtype = (np.dtype(DTYPES[precision]).name,)
    table: dict[str, Expected] = {}
    for name in spec.cases:
        n = len(fixture.case(name).tokens)
        for key in ("loss", *fixture.grad_names()):
            table[f"{CASES}{name}/{key}"] = Expected(dtype, grad_shape(fixture, key, n))
    for key in golden_train_names(fixture):
        table[TRAIN + key] = Expected(dtype, train_shape(fixture, key))
    return table


def golden_training(fixture: Fixture, precision: Precision) -> tuple[GradOutput, TrainOutput]:
    """One tier's gradient goldens ({case: {name: array}}, {step key: array}), every key, dtype and shape of
    `training_table` checked against the header, nothing extra, every value finite; each array read-only."""
    from parity_harness._fixture.files import open_checked, read_checked

    table = training_table(fixture, precision)
    path = fixture.training_golden_path(precision)
    grads: GradOutput = {}
    train: TrainOutput = {}
    for key, tensor in read_checked(open_checked(path, table, TRAINING_GOLDEN), table, TRAINING_GOLDEN):
        if key.startswith(CASES):
            case, name = key[len(CASES):].split("/", 1)  # a case's name has no "/" (the manifest's schema)
            grads.setdefault(case, {})[name] = tensor
        else:
            train[key[len(TRAIN):]] = tensor
    return grads, train


__all__ = ["CASES", "TRAIN", "GradOutput", "TrainOutput", "golden_train_names", "golden_training", "grad_shape",
           "train_shape",
           "training_table"]
