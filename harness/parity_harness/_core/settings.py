"""parity's numeric environment variables, read by one rule: a positive, finite number of seconds.

`PARITY_NODE_TIMEOUT` (the Node backends) and `PARITY_BROWSER_TIMEOUT` (the browser backends) go
through `seconds_from_env`; anything else is one line naming the variable (BackendFailed, exit 2).
"""

from __future__ import annotations

import math
import os

from parity_harness._core.errors import BackendFailed


def seconds_from_env(name: str, default: float) -> float:
    """`$name` in seconds, `default` when unset or empty; BackendFailed unless a positive finite number."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise BackendFailed(f"{name}={raw!r} must be a positive number of seconds")
    return value
