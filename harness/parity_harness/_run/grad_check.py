"""The gradient check of `parity run --grad`: every backend's backward and training steps against the goldens.

For every backend that has a backward (`Backend.supports_grad`), in fp32 and fp64 where it computes them, in
every tier that precision is judged in (as the forward taps: fp32 against the fp32 golden, fp64 against both):
each training case's loss and gradients, then (`supports_training`) each training step's loss, gradient norm
and parameters, judged by parity_harness/_compare/gradients.py. A fixture without gradient goldens is an
error here: the request layer refuses `--grad` on it before any backend runs.

Memory is bounded by a few copies of the parameters, whatever the fixture's size: the goldens are read one tensor
at a time as they are judged (`lazy_training`), and each backend x precision's results are dropped once judged
in every tier, before the next is computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from parity_harness._backends.base import Precision
from parity_harness._backends.boundary import AnyBackend, guarded
from parity_harness._compare.grad_causes import Kept, keep_candidates, name_causes
from parity_harness._compare.gradients import (
    GradReport,
    GradRun,
    backward_order,
    grad_tolerances,
    judge_backward,
    judge_training_tiers,
    train_order,
)
from parity_harness._core.precision import is_tier, tiers_for
from parity_harness._fixture.training import lazy_training

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

Progress = Callable[[str], None]


def run_gradients(fixture: Fixture, backends: Sequence[AnyBackend], precisions: list[Precision],
                  progress: Progress | None = None,
                  release_memory: Callable[[], None] = lambda: None) -> GradReport:
    """Run every backend's backward and training steps in every wanted precision it computes in; judge them.
    `release_memory`: called after each backend x precision's results are judged and dropped (the runner's)."""

    say = progress or (lambda _msg: None)
    spec = fixture.training()
    if spec is None:
        return GradReport(available=False)
    section = fixture.training_section()
    assert section is not None
    report = GradReport(True, list(spec.cases), backward_order(fixture), spec.steps, train_order(fixture),
                        spec=spec, c=dict(section.c), n_budgeted=len(section.units))
    goldens = {p: lazy_training(fixture, p) for p in ("fp32", "fp64")}  # each tensor read when judged
    tol = grad_tolerances(fixture, *goldens["fp64"])
    fixture.release_weights()  # read for the tolerances; a GPT-2-sized backend reads its own copy
    release_memory()
    kept: Kept = {}  # the candidates' arrays where a first divergence can be, for its likely cause
    for backend in [guarded(b) for b in backends]:
        if backend.declined(fixture) or not backend.has_backward(fixture):
            report.not_supported.append(backend.name)
            continue
        names = backend.grad_names(fixture)
        trains = backend.trains(fixture)
        if not trains:
            report.not_training.append(backend.name)
        for precision in precisions:
            if precision not in backend.precisions or not is_tier(precision):  # the backward: fp32 and fp64
                continue
            say(f"parity: the backward of {backend.name} ({precision}) ...")
            start = time.perf_counter()
            grads = backend.gradients(fixture, precision, names)
            seconds = time.perf_counter() - start
            for tier in tiers_for(precision):
                report.checks += judge_backward(fixture, backend.name, precision, tier, grads, goldens[tier][0], names,
                                                tol)
            keep_candidates(kept, report, backend.name, precision, grads, None)  # for the causes (grad_causes.py)
            del grads  # judged: not held while the training steps compute (a GPT-2-sized fixture's 1 GB)
            release_memory()
            start = time.perf_counter()
            train = backend.trained(fixture, precision) if trains else None
            report.runs.append(GradRun(backend.name, precision, seconds + time.perf_counter() - start))
            if train is not None:  # every tier at once: a parameter's allowances in one pass for all of them
                report.train_checks += judge_training_tiers(fixture, backend.name, precision,
                                                            {tier: goldens[tier][1] for tier in tiers_for(precision)},
                                                            train, tol)
                keep_candidates(kept, report, backend.name, precision, {}, train)
            del train  # judged: not held while the next precision computes
            release_memory()
    report.fold()
    name_causes(fixture, report, kept, goldens, tol)  # each first divergence's likely cause, from the numbers
    _locate(fixture, report)
    return report


def _locate(fixture: Fixture, report: GradReport) -> None:
    """Name each backward divergence's worst cell by the axes of the tap whose gradient it is, with the words."""
    from parity_harness._compare.judge import name_index
    from parity_reference.training import GRAD_SUFFIX

    for d in report.divergences:
        base = d.tap.removesuffix(GRAD_SUFFIX)
        if d.index is None or base not in fixture.tap_names:
            continue
        d.location, d.axes = name_index(fixture.model.axis_names(base), d.index, fixture.case(d.case).tokens,
                                        list(fixture.vocab))


__all__ = ["run_gradients"]
