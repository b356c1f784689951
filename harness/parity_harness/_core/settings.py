"""parity's numeric environment variables, each read by one rule; anything else is one line naming the
variable (BackendFailed, exit 2).

- seconds, a positive number up to MAX_SECONDS (`seconds_from_env`): `PARITY_BACKEND_TIMEOUT` (the hang
  guard, _backends/guard.py), `PARITY_NODE_TIMEOUT` (the Node backends), `PARITY_BROWSER_TIMEOUT` (the browser
  backends). A larger value (`1e300`, `inf`) is refused like a negative one: the timers it feeds
  (`signal.setitimer`, a subprocess's wait) overflow far below it, and "no deadline" is said by leaving it unset;
- a count, a whole number in a range (`count_from_env`): `PARITY_TS_THREADS` (the typescript backend's
  threads at GPT-2 size, which Node reads again).
"""

from __future__ import annotations

import math
import os

from parity_harness._core.errors import BackendFailed

MAX_SECONDS = 10_000_000.0  # ~116 days: a deadline, however generous, that every timer it feeds can hold


def seconds_from_env(name: str, default: float) -> float:
    """`$name` in seconds, `default` when unset or empty; BackendFailed (one line naming the variable, exit 2)
    unless a positive number of at most MAX_SECONDS."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise BackendFailed(f"{name}={raw!r} must be a positive number of seconds")
    if value > MAX_SECONDS:
        raise BackendFailed(f"{name}={raw!r} is out of range: at most {MAX_SECONDS:.0f} seconds "
                            "(leave it unset for the default)")
    return value


def count_from_env(name: str, low: int, high: int) -> int | None:
    """`$name` as a whole number in [low, high], None when unset or empty; BackendFailed otherwise."""
    raw = os.environ.get(name, "")
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and low <= int(raw) <= high):
        raise BackendFailed(f"{name}={raw!r} must be a whole number from {low} to {high}")
    return int(raw)
