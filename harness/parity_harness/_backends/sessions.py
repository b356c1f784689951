"""Processes a backend family keeps for one run (one Chromium for every browser backend), closed when it ends.

A family module starts such a process on first use and registers its closer here; `close_all` runs
when a run ends (`run_parity` is `@closing`: pass, fail or crash), and at the interpreter's exit, for
calls outside a run (the benchmark, `check-backend`). Closing is idempotent and never raises.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_closers: list[Callable[[], None]] = []
_lock = threading.Lock()


def register(close: Callable[[], None]) -> None:
    """Call `close` at the end of the run (once registered, until it has been called)."""
    with _lock:
        if close not in _closers:
            _closers.append(close)


def unregister(close: Callable[[], None]) -> None:
    """Forget `close` (what it closes has ended on its own)."""
    with _lock:
        if close in _closers:
            _closers.remove(close)


def close_all() -> None:
    """Close every registered session (each closer once); errors in a closer are not the run's."""
    with _lock:
        closers = list(reversed(_closers))
        _closers.clear()
    for close in closers:
        with contextlib.suppress(Exception):
            close()


def closing(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, then `close_all` whether it returned or raised: for the function that owns a run."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        finally:
            close_all()

    return wrapper


atexit.register(close_all)
