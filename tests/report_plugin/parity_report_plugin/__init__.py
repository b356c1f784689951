"""Backends for the hostile report and dump tests (tests/run/test_merge_and_dump_inputs.py).

Registered through `parity_report_plugin-0.1.0.dist-info/entry_points.txt` beside this package, as
tests/hostile_plugin is: putting `tests/report_plugin` on PYTHONPATH lets `importlib.metadata` find
them. Each computes in fp32 only (one golden tier: quick) and answers with a copy of the golden taps,
or with that copy and one logit moved by 1e-3 (a real disagreement, exit 1).
Two pairs have names that `parity_harness._run.dump.dump_name` would turn into one file name ("collide/dump"
and "collide_dump"; "Collide-Case" and "collide-case" on a case-insensitive file system).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._fixture.fixture import Fixture


class Perfect(Backend):
    """A correct backend: copies of the golden taps."""

    name: ClassVar[str] = "report-control"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return {case: {tap: np.array(a, copy=True) for tap, a in taps.items()}
                for case, taps in fixture.golden(precision).items()}


class Wrong(Perfect):
    """The golden taps with logits[0, 0] of the first case moved by 1e-3: fails (exit 1)."""

    name: ClassVar[str] = "report-wrong"

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        out = super().run(fixture, precision)
        first = next(iter(out.values()))
        first["logits"][0, 0] += 1e-3
        return out


class CollideSlashWrong(Wrong):
    name: ClassVar[str] = "collide/dump"


class CollideUnderscore(Perfect):
    name: ClassVar[str] = "collide_dump"


class CollideUpperWrong(Wrong):
    name: ClassVar[str] = "Collide-Case"


class CollideLower(Perfect):
    name: ClassVar[str] = "collide-case"


class DeclinesEverything(Perfect):
    """Declines every fixture: its runs are 'not supported', so alone it compares nothing (exit 2)."""

    name: ClassVar[str] = "declines-everything"

    def declines(self, fixture: Fixture) -> str | None:
        return "declines every fixture (a test backend)"
