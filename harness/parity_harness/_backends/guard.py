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

import signal
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
    """Record genuine Ctrl-C (SIGINT) so a KeyboardInterrupt a backend raises itself is told apart."""
    global _sigint_seen
    _sigint_seen = False
    try:
        previous = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: no handler, every KeyboardInterrupt counts as genuine
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def genuine_interrupt() -> bool:
    return _sigint_seen


def call_backend(name: str, what: str, fn: Callable[[], T]) -> T:
    """`fn()` (backend code: `what` says which, e.g. "run (fp32)"); any failure is one line, exit 2."""
    try:
        return fn()
    except KeyboardInterrupt as exc:
        if genuine_interrupt() or not _handler_installed():
            raise
        raise BackendMisbehaved(f"backend {name!r} crashed in {what}: {describe_exception(exc)}") from None
    except ParityError as exc:
        if type(exc) in CORE_ERRORS:
            raise type(exc)(one_line(_text(exc))) from None
        raise BackendMisbehaved(f"backend {name!r} failed in {what}: {describe_exception(exc)}") from None
    except BaseException as exc:  # SystemExit, GeneratorExit, custom BaseException, any Exception
        raise BackendMisbehaved(f"backend {name!r} crashed in {what}: {describe_exception(exc)}") from None


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
