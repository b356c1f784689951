"""Where parity's files that are not Python live: the TypeScript model, the toy and stress fixtures.

In a source checkout (an editable install) they are `ts_model/` (the model in `model/`, the Node entry points
in `node/`), `fixtures/toy/` and `fixtures/toy-stress/`
beside `harness/`; in an installed wheel they are package data, `parity_harness/_ts_model/`,
`parity_harness/_toy_fixture/` and `parity_harness/_stress_fixture/` (pyproject.toml maps the directories there). This
is the one place that
knows both layouts.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # parity_harness/ (this is _core/resources.py)
CHECKOUT_DIR = PACKAGE_DIR.parent.parent  # the source checkout (parity_harness/..) when parity runs from one


def _first_existing(*candidates: Path) -> Path:
    return next((c for c in candidates if c.exists()), candidates[0])


def ts_model_dir() -> Path:
    """The directory holding model/model.ts and node/run.ts: the checkout's ts_model/, else the wheel's copy."""
    return _first_existing(CHECKOUT_DIR / "ts_model" / "node" / "run.ts",
                           PACKAGE_DIR / "_ts_model" / "node" / "run.ts").parent.parent


def toy_fixture_dir() -> Path:
    """The toy fixture, every command's default: the checkout's fixtures/toy, else the wheel's copy."""
    return _first_existing(CHECKOUT_DIR / "fixtures" / "toy" / "manifest.json",
                           PACKAGE_DIR / "_toy_fixture" / "manifest.json").parent


def stress_fixture_dir() -> Path:
    """The stress fixture (_authoring/stress.py), where `parity selftest` catches the stability mutants."""
    return _first_existing(CHECKOUT_DIR / "fixtures" / "toy-stress" / "manifest.json",
                           PACKAGE_DIR / "_stress_fixture" / "manifest.json").parent
