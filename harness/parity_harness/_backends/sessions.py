"""Processes a backend family keeps for one run (one Chromium for every browser backend), closed when it ends.

A family module starts such a process on first use and registers its closer here; `close_all` runs
when a run ends (`run_parity` is `@closing`: pass, fail or crash), and at the interpreter's exit, for
calls outside a run (the benchmark, `check-backend`). Closing is idempotent and never raises.

A family that restarts such a process after a signal killed it (a Chromium that died of SIGSEGV on a loaded
machine, a Node killed from outside) says so with `note_restart`; the run's report lists each note (`closing`
puts them in the `restarts` of the report `run_parity` returns: the terminal report and the JSON `restarts`).
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
_restarts: list[str] = []  # this run's restarts, in order: "BACKEND: what was killed by which signal"
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


def note_restart(what: str) -> None:
    """Record that `what` (e.g. "the browser was killed by SIGSEGV; ...") was restarted, for the backend whose
    call this thread is in (`guard.current_backend`)."""
    from parity_harness._backends.guard import current_backend

    name = current_backend()
    with _lock:
        _restarts.append(f"{name}: {what}" if name else what)


def restarts() -> list[str]:
    """The restarts noted since the run began (or since the process began, outside a run)."""
    with _lock:
        return list(_restarts)


def closing(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, then `close_all` whether it returned or raised: for the function that owns a run. The restarts
    noted while it ran are added to the `restarts` list of what it returns (run_parity's Report), if it has one."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with _lock:
            _restarts.clear()
        try:
            result = fn(*args, **kwargs)
            listed = getattr(result, "restarts", None)
            if isinstance(listed, list):
                listed.extend(restarts())
            return result
        finally:
            close_all()

    return wrapper


atexit.register(close_all)
