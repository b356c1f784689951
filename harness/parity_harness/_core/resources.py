"""Where parity's files that are not Python live: the TypeScript model, the toy and stress fixtures; and
where its caches go (`user_cache_dir`).

In a source checkout (an editable install) they are `ts_model/` (the model in `model/`, the Node entry points
in `node/`), `fixtures/toy/` and `fixtures/toy-stress/`
beside `harness/`; in an installed wheel they are package data, `parity_harness/_ts_model/`,
`parity_harness/_toy_fixture/` and `parity_harness/_stress_fixture/` (pyproject.toml maps the directories there). This
is the one place that
knows both layouts.
"""

from __future__ import annotations

import os
import tempfile
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


def user_cache_dir(name: str) -> Path:
    """parity's cache `name` in the user's cache directory: $XDG_CACHE_HOME/parity/NAME, else
    ~/.cache/parity/NAME, else a per-user directory in the temp directory; never the checkout or the
    working directory. What is kept there is keyed by content (torch-compile's graphs, Node's compile cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or (str(Path.home() / ".cache") if Path.home().is_dir() else "")
    if base and Path(base).is_absolute():
        return Path(base) / "parity" / name
    return Path(tempfile.gettempdir()) / f"parity-{name}-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
