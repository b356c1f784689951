"""The manifest's `training` section as pure data: the backward's cases and the training step, checked.

A fixture may carry gradient goldens (optional and additive, like decoding's). The manifest then holds

    "training": {"loss": "next-token cross-entropy ...", "cases": [...], "steps": N, "lr": [...],
                 "betas": [b1, b2], "eps": e, "weight_decay": w, "no_decay": [...],
                 "c": {"fp32": c32, "fp64": c64}, "units": {name: u}, "platform": {...}}
    "files": {..., "training": {"fp32": "golden.grad.fp32.safetensors", "fp64": "golden.grad.fp64.safetensors"}}

parity_reference/training.py defines the loss, the gradients, their order and the step; the golden
files hold `cases/{case}/{name}` (each case's "loss" and every gradient) and `train/step{s}/{name}`.
`c` is the gradient tolerances' constant per tier (atol = c * eps * M, _compare/gradients.py), when not the
default, bounded by `C_CEILING`; `units` the measured error of the reference's float32 backward, in eps32 * M,
of the gradients and training records where BUDGET_FACTOR times it exceeds c: their c is raised to that, at most
`UNITS_CEILING` (docs/tolerances.md, "Gradients").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parity_harness._core.errors import FixtureError
from parity_harness._core.precision import TIERS
from parity_reference.training import TrainingSpec, predicted_cells

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

GOLDEN_FILES = {"fp32": "golden.grad.fp32.safetensors", "fp64": "golden.grad.fp64.safetensors"}
# The gradient tolerance's c per tier, measured (docs/tolerances.md, "Gradients"), and its ceiling.
DEFAULT_C = {"fp32": 64.0, "fp64": 512.0}
C_CEILING = {"fp32": 1024.0, "fp64": 8192.0}
MAX_STEPS = 100
BUDGET_FACTOR = 4.0  # a measured error's margin: c of a name is at least this times its measured units
UNITS_CEILING = 1e6  # BUDGET_FACTOR x units at most 4e6: fp32 atol <= 0.48 M, fp64 <= 9e-10 M


@dataclass(frozen=True)
class TrainingSection:
    """The manifest's training section: the spec, c per tier, and the measured units by name."""

    spec: TrainingSpec
    c: dict[str, float]
    units: dict[str, float]


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_training_section(manifest: Mapping[str, Any], files: Mapping[str, Any],
                           case_lengths: Mapping[str, int], manifest_path: str) -> TrainingSection | None:
    """The `training` section checked as data; None when the fixture has none."""
    raw, names = manifest.get("training"), files.get("training")
    if raw is None and names is None:
        return None

    def fail(what: str) -> FixtureError:
        return FixtureError(f"{manifest_path}: training: {what}")

    if not isinstance(raw, dict) or not isinstance(names, dict):
        raise fail("needs both the 'training' section and files.training, as objects")
    for p in TIERS:
        if not isinstance(names.get(p), str):
            raise fail(f"files.training.{p} must name the {p} gradient golden file")
    steps = raw.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise fail(f"steps must be an integer in [1, {MAX_STEPS}], got {steps!r}")
    lr = raw.get("lr")
    if not isinstance(lr, list) or len(lr) != steps or not all(_number(x) and x >= 0 for x in lr):
        raise fail(f"lr must be a list of {steps} non-negative numbers (one per step)")
    betas = raw.get("betas")
    if not isinstance(betas, list) or len(betas) != 2 or not all(_number(b) and 0 <= b < 1 for b in betas):
        raise fail("betas must be two numbers in [0, 1)")
    eps, decay = raw.get("eps"), raw.get("weight_decay")
    if not _number(eps) or eps <= 0:  # type: ignore[operator]
        raise fail(f"eps must be a positive number, got {eps!r}")
    if not _number(decay) or decay < 0:  # type: ignore[operator]
        raise fail(f"weight_decay must be a non-negative number, got {decay!r}")
    no_decay = raw.get("no_decay", [])
    if not isinstance(no_decay, list) or not all(isinstance(n, str) for n in no_decay):
        raise fail("no_decay must be a list of parameter names")
    cases = raw.get("cases")
    if not isinstance(cases, list) or not cases or len(set(map(str, cases))) != len(cases):
        raise fail("cases must be a non-empty list of distinct case names")
    for name in cases:
        if name not in case_lengths:
            raise fail(f"case {name!r} is not a case of the fixture")
        if predicted_cells(case_lengths[name]) < 1:
            raise fail(f"case {name!r} has one token: it predicts nothing, so it has no loss")
    c = raw.get("c", DEFAULT_C)
    if not isinstance(c, dict) or set(c) != set(TIERS) or not all(_number(c[t]) and c[t] > 0 for t in TIERS):
        raise fail("c must give a positive number for fp32 and fp64")
    for t in TIERS:
        if c[t] > C_CEILING[t]:
            raise fail(f"c.{t} = {c[t]} is beyond the ceiling {C_CEILING[t]} (docs/tolerances.md, 'Gradients')")
    units = raw.get("units", {})
    if not isinstance(units, dict) or not all(isinstance(k, str) and _number(v) and v >= 0 for k, v in units.items()):
        raise fail("units must map names to non-negative numbers")
    for key, u in units.items():
        if u > UNITS_CEILING:
            raise fail(f"units of {key!r} = {u} is beyond the ceiling {UNITS_CEILING:g} (docs/tolerances.md, "
                       "'Gradients')")
    spec = TrainingSpec(steps, tuple(float(x) for x in lr), (float(betas[0]), float(betas[1])), float(eps),  # type: ignore[arg-type]
                        float(decay), tuple(no_decay), tuple(cases))  # type: ignore[arg-type]
    return TrainingSection(spec, {t: float(c[t]) for t in TIERS}, {k: float(v) for k, v in units.items()})


def check_no_decay(spec: TrainingSpec, params: Sequence[str], manifest_path: str) -> None:
    unknown = [n for n in spec.no_decay if n not in params]
    if unknown:
        raise FixtureError(f"{manifest_path}: training: no_decay names {unknown[0]!r}, not a parameter of the model")


__all__ = ["BUDGET_FACTOR", "C_CEILING", "DEFAULT_C", "GOLDEN_FILES", "UNITS_CEILING", "TrainingSection",
           "check_no_decay", "parse_training_section"]
