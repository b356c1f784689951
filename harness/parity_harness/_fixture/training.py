"""The gradient goldens: what a tier's file holds, read through the one checked reader.

A fixture with a `training` section (_fixture/training_section.py) has one file per tier holding
`cases/{case}/loss` (shape []) and `cases/{case}/{name}.grad` for every training case and every gradient
of `Fixture.grad_names()` (each case's own loss), then `train/step{s}/loss`, `train/step{s}/grad_norm` (shape
[]), `train/step{s}/{param}` for every step and parameter (parity_reference/training.py), and the judge's own
`train/step{s}/{param}.grad`, each step's batch gradient.

`golden_training` reads a whole tier into memory (the toys); `lazy_training` only checks the file's header and
reads each tensor when it is asked for, not keeping it: what `parity run --grad` judges from, so that a
GPT-2-sized fixture's goldens (124 M values per parameter set, docs/performance.md) never sit in memory at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import DTYPES, Precision
from parity_reference.tensor_check import TRAINING_GOLDEN, Expected
from parity_reference.training import GRAD_SUFFIX, step_key, train_names

if TYPE_CHECKING:
    from parity_harness._fixture.files import TensorFile
    from parity_harness._fixture.fixture import Fixture

GradOutput = Mapping[str, Mapping[str, np.ndarray]]  # {case: {"loss" | "{name}.grad": array}}
TrainOutput = Mapping[str, np.ndarray]  # {"step{s}/loss" | "step{s}/grad_norm" | "step{s}/{param}": array}
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


def golden_training(fixture: Fixture, precision: Precision) -> tuple[dict[str, dict[str, np.ndarray]],
                                                                    dict[str, np.ndarray]]:
    """One tier's gradient goldens ({case: {name: array}}, {step key: array}), every key, dtype and shape of
    `training_table` checked against the header, nothing extra, every value finite; each array read-only."""
    from parity_harness._fixture.files import open_checked, read_checked

    table = training_table(fixture, precision)
    path = fixture.training_golden_path(precision)
    grads: dict[str, dict[str, np.ndarray]] = {}
    train: dict[str, np.ndarray] = {}
    for key, tensor in read_checked(open_checked(path, table, TRAINING_GOLDEN), table, TRAINING_GOLDEN):
        if key.startswith(CASES):
            case, name = key[len(CASES):].split("/", 1)  # a case's name has no "/" (the manifest's schema)
            grads.setdefault(case, {})[name] = tensor
        else:
            train[key[len(TRAIN):]] = tensor
    return grads, train


class LazyTensors(Mapping[str, np.ndarray]):
    """Some tensors of a checked golden file (`open_checked`), by key (the file's name less `prefix`): each read, and
    its values checked, when asked for, and not kept (read-only, as `golden_training`'s)."""

    def __init__(self, f: TensorFile, prefix: str, keys: list[str]) -> None:
        self._file, self._prefix, self._keys = f, prefix, dict.fromkeys(keys)

    def __getitem__(self, key: str) -> np.ndarray:
        from parity_harness._fixture.files import read_checked

        if key not in self._keys:
            raise KeyError(key)
        name = self._prefix + key
        return dict(read_checked(self._file, [name], TRAINING_GOLDEN))[name]  # consumed to the end: file closed

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def lazy_training(fixture: Fixture, precision: Precision) -> tuple[GradOutput, TrainOutput]:
    """One tier's gradient goldens as `golden_training` gives them, the header checked now (every key, dtype and
    shape of `training_table`, nothing extra) and each tensor read from the file when it is looked up (values
    checked then): memory holds the tensors being judged, not the tier."""
    from parity_harness._fixture.files import open_checked

    table = training_table(fixture, precision)
    f = open_checked(fixture.training_golden_path(precision), table, TRAINING_GOLDEN)
    by_case: dict[str, list[str]] = {}
    train: list[str] = []
    for key in table:
        if key.startswith(CASES):
            case, name = key[len(CASES):].split("/", 1)
            by_case.setdefault(case, []).append(name)
        else:
            train.append(key[len(TRAIN):])
    grads = {case: LazyTensors(f, f"{CASES}{case}/", names) for case, names in by_case.items()}
    return grads, LazyTensors(f, TRAIN, train)


__all__ = ["CASES", "TRAIN", "GradOutput", "LazyTensors", "TrainOutput", "golden_train_names", "golden_training",
           "grad_shape", "lazy_training", "train_shape", "training_table"]
