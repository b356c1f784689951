"""Every call into backend code goes through `call_backend`: whatever it raises becomes one line, exit 2.

A backend is code running in parity's process. Its exceptions, `SystemExit` (a `sys.exit()` in
`run` once ended `parity run` with exit 0 and no verdict), `GeneratorExit`, any custom
`BaseException`, and a `KeyboardInterrupt` it raises itself, become `BackendFailed("backend X
crashed ...")`. A genuine Ctrl-C (a SIGINT seen by the handler `install_sigint_handler` puts in
place) still ends the run with exit 130. A `ParityError` of parity's own classes passes through
with its text made one line; a subclass a plugin defines (which could set `exit_code = 0`) is
re-raised as `BackendFailed`. The CLI decides exit codes, never the exception (parity_harness/_cli/main.py).
What this cannot stop is in docs/security.md: an in-process plugin can still call `os._exit(0)`.
"""

from __future__ import annotations

import math
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from parity_harness._core.errors import BackendFailed, BackendMisbehaved, BackendUnavailable, FixtureError, ParityError

T = TypeVar("T")
CORE_ERRORS: tuple[type[ParityError], ...] = (ParityError, FixtureError, BackendUnavailable, BackendFailed,
                                             BackendMisbehaved)
_sigint_seen = False


def one_line(text: str, limit: int = 400) -> str:
    """`text` as a single printable line (_core/sanitize.py: breaks a space, other unsafe characters escaped)."""
    from parity_harness._core.sanitize import one_line as sanitized

    return sanitized(text, limit)


def describe_exception(exc: BaseException) -> str:
    """'TypeName: first line of the message', never raising (a hostile __str__ included)."""
    try:
        name = type(exc).__name__
        name = name if isinstance(name, str) else "exception"
    except BaseException:
        name = "exception"
    try:
        text = str(exc)
    except BaseException:
        text = "(its message could not be printed)"
    first = next((ln for ln in text.splitlines() if ln.strip()), "") if isinstance(text, str) else ""
    return one_line(f"{name}: {first}" if first else name)


def _on_sigint(signum: int, frame: Any) -> None:
    global _sigint_seen
    _sigint_seen = True
    raise KeyboardInterrupt


@contextmanager
def sigint_handler() -> Iterator[None]:
    """Record a genuine Ctrl-C (SIGINT) so a KeyboardInterrupt a backend raises itself is told apart.

    SIGTERM (a CI job cancelled, `timeout`) is taken as the same interrupt: without a handler Python dies
    at once, leaving a fixture's staging directory beside it and a stale report where `--json` points;
    as a KeyboardInterrupt the command cleans up, marks `--json` unusable and exits 130.
    """
    global _sigint_seen
    _sigint_seen = False
    try:
        previous = {sig: signal.signal(sig, _on_sigint) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: no handler, every KeyboardInterrupt counts as genuine
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def genuine_interrupt() -> bool:
    return _sigint_seen


def call_backend(name: str, what: str, fn: Callable[[], T], work: int = 1) -> T:
    """`fn()` (backend code: `what` says which, e.g. "run (fp32)"); any failure is one line, exit 2.

    A crash keeps its full traceback in the error's `detail` (`parity run -v` prints it). `work`: how many
    cases the call computes, for the hang guard (`deadline`: PARITY_BACKEND_TIMEOUT seconds per case).
    """
    try:
        with deadline(name, what, work):
            return fn()
    except BackendTimeout as exc:
        raise BackendMisbehaved(str(exc)) from None
    except KeyboardInterrupt as exc:
        if genuine_interrupt() or not _handler_installed():
            raise
        raise _crashed(name, what, exc) from None
    except ParityError as exc:
        if type(exc) in CORE_ERRORS:
            raise type(exc)(one_line(_text(exc))) from None
        raise BackendMisbehaved(f"backend {name!r} failed in {what}: {describe_exception(exc)}") from None
    except BaseException as exc:  # SystemExit, GeneratorExit, custom BaseException, any Exception
        raise _crashed(name, what, exc) from None


def _crashed(name: str, what: str, exc: BaseException) -> BackendMisbehaved:
    """The one line of a crash, with the backend's full traceback as its `detail` (never raising)."""
    error = BackendMisbehaved(f"backend {name!r} crashed in {what}: {describe_exception(exc)}")
    try:
        lines = traceback.format_exception(exc)
        text = "".join(lines[-_TRACEBACK_LINES:])
    except BaseException:  # a hostile __str__ or __traceback__: the one line is all there is
        text = ""
    error.detail = text if isinstance(text, str) else ""
    return error


# -- the hang guard ---------------------------------------------------------------------------------

TIMEOUT_VARIABLE = "PARITY_BACKEND_TIMEOUT"
_TRACEBACK_LINES = 400  # the last lines of a traceback kept (a deep recursion's is cut, its end is the cause)
_armed = False


class BackendTimeout(BaseException):
    """Raised in the main thread by the alarm when a backend call overran its deadline (never by backend code)."""


@contextmanager
def deadline(name: str, what: str, work: int = 1) -> Iterator[None]:
    """A guard against a hung in-process backend: `work` x $PARITY_BACKEND_TIMEOUT seconds for this call.

    Unset (the default): no deadline. Set: a call that has not returned when it runs out ends the run with
    one line naming the backend (BackendTimeout, made BackendMisbehaved by `call_backend`, exit 2). It is
    a SIGALRM timer (`signal.setitimer`), so only on POSIX and in the main thread; elsewhere (Windows, a
    worker thread) there is no deadline. The alarm interrupts Python code and interruptible waits (sleep,
    a subprocess, a socket); a native call that never returns to Python is only stopped when it does.
    A call made inside another's deadline runs under the outer one.
    """
    global _armed
    from parity_harness._core.settings import seconds_from_env

    seconds = seconds_from_env(TIMEOUT_VARIABLE, math.inf) * max(1, work)
    if _armed or not math.isfinite(seconds) or not hasattr(signal, "setitimer") \
            or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _expired(signum: int, frame: Any) -> None:
        raise BackendTimeout(f"backend {name!r} did not return from {what} within {seconds:g} s "
                             f"({TIMEOUT_VARIABLE}={seconds_from_env(TIMEOUT_VARIABLE, math.inf):g} s per case): "
                             "it hangs, or the deadline is too short for this machine")

    previous = signal.signal(signal.SIGALRM, _expired)
    _armed = True
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _armed = False


def reraise_if_interrupt(exc: BaseException) -> None:
    """For code that reports a backend's exceptions instead of stopping: let a genuine Ctrl-C through."""
    if isinstance(exc, KeyboardInterrupt) and (genuine_interrupt() or not _handler_installed()):
        raise exc


def _text(exc: BaseException) -> str:
    try:
        text = str(exc)
        return text if isinstance(text, str) else ""
    except BaseException:
        return "(its message could not be printed)"


def _handler_installed() -> bool:
    try:
        return signal.getsignal(signal.SIGINT) is _on_sigint
    except ValueError:
        return False
