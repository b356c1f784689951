"""The gradient goldens: every training case's backward and the training steps, by the reference's autograd.

`write_training_files` computes them with parity_reference/backward.py in float32 and in float64 (the
float32 weights upcast) and writes one file per tier (_fixture/training.py says what it holds);
`training_section` is the manifest's `training` section for a spec. `add_training` extends an existing
fixture's manifest with both, re-sealed (through the same `extend_manifest` decoding uses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._core.precision import DTYPES, TIERS
from parity_harness._fixture.training import CASES, TRAIN
from parity_harness._fixture.training_section import GOLDEN_FILES
from parity_reference.training import TrainingSpec, predicted_cells

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture
    from parity_harness._fixture.manifest import Case
    from parity_reference.families import ModelConfig

LOSS = ("the mean next-token cross-entropy over a case's T - 1 predicted cells; a batch: one mean over all its "
        "cells (parity_reference/training.py)")


def training_cases(cases: Sequence[Case]) -> list[str]:
    """The cases with a loss: every case of two tokens or more, in the fixture's order."""
    return [c.name for c in cases if predicted_cells(len(c.tokens)) >= 1]


def one_dimensional(param_shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """The gains and biases (every parameter of fewer than two axes): what nanoGPT's AdamW does not decay."""
    return [name for name, shape in param_shapes.items() if len(shape) < 2]


def training_section(spec: TrainingSpec) -> dict[str, Any]:
    from parity_harness._fixture.platforms import current_platform

    return {"loss": LOSS, **spec.to_dict(), "platform": current_platform()}


def write_training_files(root: Path, weights: Mapping[str, np.ndarray], config: ModelConfig,
                         cases: Sequence[Case], spec: TrainingSpec,
                         progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Write both tiers' gradient goldens into `root`; returns (the manifest's section, files.training)."""
    from parity_harness._authoring.fixture_writer import save_tensors
    from parity_reference.backward import case_gradients, train_steps

    say = progress or (lambda _message: None)
    by_name = {c.name: c for c in cases}
    batch = [list(by_name[name].tokens) for name in spec.cases]
    for precision in TIERS:
        say(f"gradient goldens {precision}: {len(spec.cases)} cases, {spec.steps} training steps")
        dtype = DTYPES[precision]
        tensors: dict[str, np.ndarray] = {}
        for name in spec.cases:
            for key, value in case_gradients(weights, config, by_name[name].tokens, precision).items():
                tensors[f"{CASES}{name}/{key}"] = np.array(value, dtype=dtype, order="C")  # keeps a 0-d loss 0-d
        for key, value in train_steps(weights, config, batch, spec, precision, with_grads=True).items():
            tensors[TRAIN + key] = np.array(value, dtype=dtype, order="C")  # (np.ascontiguousarray would not)
        save_tensors(tensors, root / GOLDEN_FILES[precision])
    return training_section(spec), dict(GOLDEN_FILES)


def add_training(root: Path, weights: Mapping[str, np.ndarray], config: ModelConfig, cases: Sequence[Case],
                 spec: TrainingSpec, progress: Callable[[str], None] | None = None) -> None:
    """Write the gradient goldens into the fixture being written at `root` and add them to its manifest."""
    from parity_harness._authoring.decoding_writer import extend_manifest
    from parity_harness._compare.gradients import measure_units
    from parity_harness._fixture.fixture import load_fixture

    section, files = write_training_files(root, weights, config, cases, spec, progress)
    extend_manifest(root, section, files, key="training")
    units = measure_units(load_fixture(root))  # the reference's float32 error, where it exceeds the default c
    if units:
        extend_manifest(root, {**section, "units": units}, files, key="training")


# The weight decay of the fixtures whose training step decays (toy-stress, toy-llama): the lesson's is 0.0, so a decay
# applied where it is excluded (or the reverse) would be invisible on the toy.
DECAY = 0.1


def decayed_spec(cases: Sequence[Case], param_shapes: Mapping[str, Sequence[int]]) -> TrainingSpec:
    """The lesson's AdamW and schedule with a weight decay of DECAY on the matrices only (gains and biases excluded,
    as nanoGPT does)."""
    from parity_reference.backward import lesson_spec

    return lesson_spec(training_cases(cases), weight_decay=DECAY, no_decay=one_dimensional(param_shapes))


def spec_for_kind(kind: str | None, cases: Sequence[Case], config: ModelConfig) -> TrainingSpec:
    """The training step parity writes for a fixture of `kind` (`fixture_kind`): the lesson's AdamW on the toy and
    the presets (weight decay 0.0, as train_tiny.py), a decay of 0.1 on the matrices for toy-stress and toy-llama;
    on gpt2-small (`SCALED_TRAINING`) its longest case and one step (`scaled_spec`)."""
    from parity_reference.backward import lesson_spec
    from parity_reference.families import family_of

    if kind == "toy-stress":  # _authoring/stress.py's `stress_training`
        return decayed_spec(cases, family_of(config).module("params").param_shapes(config))
    authoring = family_of(config).module("authoring")
    if hasattr(authoring, "training_spec") and kind is not None and kind != "toy":
        return authoring.training_spec(cases, config)  # type: ignore[no-any-return]
    if kind in SCALED_TRAINING:
        return scaled_spec(cases)
    return lesson_spec(training_cases(cases))


# The GPT-2-sized presets whose gradient goldens hold one case and one step (`scaled_spec`, docs/performance.md).
SCALED_TRAINING = ("gpt2-small",)


def scaled_spec(cases: Sequence[Case]) -> TrainingSpec:
    """A GPT-2-sized fixture's training section: the longest training case alone, one step of the lesson's AdamW.

    Every parameter's gradient is as large as the weights (124 M values: 0.5 GB in float32, 1 GB in float64), per
    case and per step, and a step also records the parameters after it and the batch gradient the judge reads: one
    case and one step keep both tiers' goldens near 5 GB and a backward check near a few copies of the weights, and
    still exercise every gradient (attention over the longest case's positions) and one AdamW update (step 1: m and
    v from zero, the bias corrections at t = 1)."""
    from parity_reference.backward import lesson_spec

    longest = max(training_cases(cases), key=lambda name: len(next(c for c in cases if c.name == name).tokens))
    return lesson_spec([longest], steps=1)


def add_training_to_fixture(root: Path, progress: Callable[[str], None] | None = None) -> None:
    """`parity export --training-only`: add (or rewrite) the gradient goldens of an existing fixture parity wrote; no
    other file changes, nothing is retrained. The fixture is copied beside itself, the goldens and the manifest's
    `training` section written into the copy, the copy loaded and checked, and only then swapped in."""
    from parity_harness._authoring.fixture_writer import copy_file, fixture_kind, owned_entries
    from parity_harness._core.errors import ParityError
    from parity_harness._core.safe_write import replace_directory, staging_directory
    from parity_harness._fixture.fixture import load_fixture

    fixture = load_fixture(root)
    kind = fixture_kind(fixture.manifest)
    if kind is None:
        raise ParityError(f"--training-only --fixture {root}: not a fixture made by `parity export` (nothing was "
                          "changed)")
    owned = owned_entries(root, kind)
    weights = fixture.weights()
    spec = spec_for_kind(kind, fixture.cases, fixture.model.config)
    with staging_directory(root) as staging:
        for name in sorted(owned):
            if name not in GOLDEN_FILES.values():
                copy_file(root / name, staging / name)
        add_training(staging, weights, fixture.model.config, fixture.cases, spec, progress)
        load_fixture(staging).training()  # validate what was written before replacing anything
        replace_directory(staging, root, owned)


def check_training_goldens(fixture: Fixture, regen: Fixture, say: Callable[[str], None]) -> list[str]:
    """`parity export --check`: the gradient goldens recomputed into `regen` against the committed ones. Bit for bit
    on the platform that made them (the training section's `platform`); on another, the recomputed goldens are judged
    as a backend's results would be, by the gradient judge at the fixture's own tolerances (AdamW's rounding-driven
    steps included). The problems found, one line each."""
    from parity_harness._compare.gradients import grad_tolerances, judge_backward, judge_training
    from parity_harness._fixture.platforms import current_platform, describe, same_platform
    from parity_harness._fixture.training import golden_training

    section = fixture.training_section()
    if section is None:
        say("the fixture has no gradient goldens: not checked")
        return []
    made_on = fixture.manifest["training"].get("platform")
    same = same_platform(made_on, current_platform())
    say(f"gradient goldens made on: {describe(made_on)}; rule: {'bit-identical' if same else 'the gradient judge'}")
    problems: list[str] = []
    regen_section = regen.training_section()
    if regen_section is None or regen_section.spec != section.spec:
        return ["training section: the recomputed spec differs (cases, steps or the optimizer)"]
    if same and regen_section.units != section.units:
        problems.append("training section: the measured units differ on the platform that made them")
    theirs = {p: golden_training(fixture, p) for p in TIERS}
    ours = {p: golden_training(regen, p) for p in TIERS}
    if same:
        for p in TIERS:
            differ = [f"{case}/{k}" for case, grads in ours[p][0].items() for k, v in grads.items()
                      if not np.array_equal(v, theirs[p][0][case][k])]
            differ += [k for k, v in ours[p][1].items() if not np.array_equal(v, theirs[p][1][k])]
            say(f"gradient golden {p}: {'bit-identical' if not differ else f'{len(differ)} tensors differ'}")
            if differ:
                problems.append(f"gradient golden {p}: {len(differ)} tensors differ, e.g. {differ[0]!r}")
        return problems
    tol = grad_tolerances(fixture, *theirs["fp64"])
    names = fixture.grad_names()
    for p in TIERS:
        checks = judge_backward(fixture, "recomputed", p, p, ours[p][0], theirs[p][0], names, tol)
        checks += judge_training(fixture, "recomputed", p, p, ours[p][1], theirs[p][1], tol)
        bad = [c for c in checks if c.passed is False]
        say(f"gradient golden {p}: {len(checks) - len(bad)} of {len(checks)} checks within the judge's tolerances")
        if bad:
            where = f"{bad[0].case}/{bad[0].tap}" + (f" (step {bad[0].step})" if bad[0].step else "")
            problems.append(f"gradient golden {p}: {len(bad)} checks break the judge's tolerances, e.g. {where}")
    return problems


__all__ = ["DECAY", "LOSS", "add_training", "add_training_to_fixture", "check_training_goldens", "decayed_spec",
           "one_dimensional", "spec_for_kind", "training_cases", "training_section", "write_training_files"]
