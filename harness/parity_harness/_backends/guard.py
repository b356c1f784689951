"""Every call into backend code goes through `call_backend`: whatever it raises becomes one line, exit 2.

A backend is code running in parity's process. Its exceptions, `SystemExit` (a `sys.exit()` in
`run` once ended `parity run` with exit 0 and no verdict), `GeneratorExit`, any custom
`BaseException`, and a `KeyboardInterrupt` it raises itself, become `BackendFailed("backend X
crashed ...")`. A genuine Ctrl-C (a SIGINT seen by the handler `install_sigint_handler` puts in
place) still ends the run with exit 130. A `ParityError` of parity's own classes passes through
with its text made one line; a subclass a plugin defines (which could set `exit_code = 0`) is
re-raised as `BackendFailed`. The CLI decides exit codes, never the exception (parity_harness/_cli/main.py).
A call that closes or replaces `sys.stdout`/`sys.stderr` is one line naming it (`_StreamWatch`), and a
call past its deadline is stopped whatever it catches or masks (`deadline`). `current_backend()` names
the backend whose call the current thread is in (for notes such as a restarted browser, _backends/sessions.py).
What this cannot stop is in docs/security.md: an in-process plugin can still call `os._exit(0)`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from parity_harness._backends.interrupts import defer
from parity_harness._core.errors import BackendMisbehaved, ParityError, is_own_error

T = TypeVar("T")
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


class _Call:
    """A backend call in progress on the main thread (`call_backend`), for the interrupt's watchdog."""

    def __init__(self, name: str) -> None:
        self.name = name


_main_call: _Call | None = None


def _on_sigint(signum: int, frame: Any) -> None:
    global _sigint_seen
    _sigint_seen = True
    if defer(_raise_interrupt):  # inside a stream swap: raised when it is whole (interrupts.py)
        return
    _raise_interrupt()


def _raise_interrupt() -> None:
    call = _main_call
    if call is not None:  # backend code runs: if it swallows the interrupt, the process ends anyway
        threading.Thread(target=_interrupt_watch, args=(call,), name="parity-interrupt", daemon=True).start()
    raise KeyboardInterrupt


def _interrupt_watch(call: _Call) -> None:
    time.sleep(GRACE_S)
    if _main_call is call:
        hard_stop(f"backend {call.name!r} did not stop within {GRACE_S:g} s of the interrupt (it catches or "
                  "masks it), so parity ended the process", interrupted=True)


@contextmanager
def sigint_handler() -> Iterator[None]:
    """Record a genuine Ctrl-C (SIGINT) so a KeyboardInterrupt a backend raises itself is told apart.

    SIGTERM (a CI job cancelled, `timeout`) is taken as the same interrupt: without a handler Python dies
    at once, leaving a fixture's staging directory beside it and a stale report where `--json` points;
    as a KeyboardInterrupt the command cleans up, marks `--json` unusable and exits 130. A backend that
    swallows it is interrupted again when its call returns (`call_backend`), and one whose call does not
    return within GRACE_S is ended (`hard_stop`, exit 130).
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
    A call that closed sys.stdout or sys.stderr, or left another object in their place, is BackendMisbehaved
    naming the backend and the call, with usable streams put back first (`_StreamWatch`).
    """
    global _main_call
    watch = _StreamWatch()
    outer = getattr(_local, "backend", None)
    _local.backend = name
    on_main = threading.current_thread() is threading.main_thread()
    outer_call, seen = _main_call, _sigint_seen
    if on_main:
        _main_call = _Call(name)
    try:
        try:
            with deadline(name, what, work):
                result = fn()
            if on_main and _sigint_seen and not seen:  # a genuine interrupt the call swallowed
                raise KeyboardInterrupt
            return result
        finally:
            _local.backend = outer
            if on_main:
                _main_call = outer_call
            broken = watch.end()
            if broken:  # whatever the call returned or raised, the streams it broke are the error
                raise BackendMisbehaved(f"backend {name!r} {broken} in {what} (parity restored them; a backend "
                                        "must leave sys.stdout and sys.stderr as it found them)") from None
    except BackendTimeout as exc:
        raise BackendMisbehaved(str(exc)) from None
    except KeyboardInterrupt as exc:
        if genuine_interrupt() or not _handler_installed():
            raise
        raise _crashed(name, what, exc) from None
    except ParityError as exc:
        if is_own_error(exc):
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
GRACE_S = 2.0  # after a deadline: the stop raised again every RERAISE_S, then the process ended
RERAISE_S = 0.25
_MAX_TIMER_S = 1e8  # what signal.setitimer holds on every platform (x cases can pass MAX_SECONDS)
_local = threading.local()  # per thread: `armed` (a deadline runs), `backend` (whose call this is)
_hard_stop_hooks: list[Callable[[str, int], None]] = []
_hard_stop_lock = threading.Lock()


class BackendTimeout(BaseException):
    """Raised in the main thread by the alarm when a backend call overran its deadline (never by backend code)."""


def current_backend() -> str | None:
    """The backend whose call (`call_backend`) the current thread is in, or None."""
    name = getattr(_local, "backend", None)
    return name if isinstance(name, str) else None


@contextmanager
def hard_stop_hook(hook: Callable[[str, int], None]) -> Iterator[None]:
    """While inside: `hook(line, exit_code)` is called (never raising into the stop) before a hard stop ends the
    process, e.g. to leave `--json` marked unusable (parity_harness/_cli/main.py)."""
    with _hard_stop_lock:
        _hard_stop_hooks.append(hook)
    try:
        yield
    finally:
        with _hard_stop_lock:
            if hook in _hard_stop_hooks:
                _hard_stop_hooks.remove(hook)


def hard_stop(line: str, interrupted: bool = False) -> None:
    """End the process now: the hooks, the streams flushed (bounded), `parity: error: LINE` on fd 2, exit 2
    (`interrupted`: `parity: interrupted: LINE`, exit 130).

    For a backend that cannot be stopped in-process: it caught or masked every stop, or sits in native code.
    `os._exit`, so no thread a backend holds and no handler it installed can keep the process alive."""
    from parity_harness._backends.quiet import put_back_descriptors
    from parity_harness._cli.exit_codes import BAD_INPUT, INTERRUPTED  # the CLI's codes (exit_codes.py)

    put_back_descriptors()  # a backend silenced (fd 1 and 2 to a temporary file): the line reaches the terminal
    code, head = (INTERRUPTED, "interrupted") if interrupted else (BAD_INPUT, "error")
    with _hard_stop_lock:
        hooks = list(_hard_stop_hooks)
    for hook in hooks:
        with contextlib.suppress(BaseException):
            hook(line, code)
    flusher = threading.Thread(target=_flush_streams, daemon=True)  # a backend may hold a stream's lock
    flusher.start()
    flusher.join(1.0)
    with contextlib.suppress(OSError):
        os.write(2, f"parity: {head}: {one_line(line)}\n".encode("utf-8", "backslashreplace"))
    os._exit(code)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):
            stream.flush()  # type: ignore[union-attr]


class _Watchdog:
    """A thread, independent of signals, that ends the process GRACE_S after a deadline the call outlived.

    In the grace it raises the stop again (SIGALRM to the main thread, every RERAISE_S) while parity's
    handler is the one installed: a backend that swallowed one BackendTimeout meets the next, one that
    cancelled the timer meets it anyway. One that catches every stop, or masks SIGALRM, or sits in native
    code, is ended by `hard_stop`."""

    def __init__(self, seconds: float, line: str, handler: Callable[[int, Any], None] | None) -> None:
        self.seconds, self.line, self.handler = seconds, line, handler
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.main = threading.main_thread().ident
        self.thread = threading.Thread(target=self._watch, name="parity-deadline", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        if self.done.wait(self.seconds):
            return
        end = time.monotonic() + GRACE_S
        while time.monotonic() < end:
            with self.lock:
                if self.done.is_set():
                    return
                if self.handler is not None and self.main is not None \
                        and signal.getsignal(signal.SIGALRM) is self.handler:
                    with contextlib.suppress(Exception):
                        signal.pthread_kill(self.main, signal.SIGALRM)
            if self.done.wait(RERAISE_S):
                return
        with self.lock:
            if self.done.is_set():
                return
        hard_stop(f"{self.line}; it did not stop within {GRACE_S:g} s of its deadline (it catches or masks the "
                  "stop), so parity ended the process")

    def stop(self) -> None:
        with self.lock:  # after this, no SIGALRM is sent
            self.done.set()


@contextmanager
def deadline(name: str, what: str, work: int = 1) -> Iterator[None]:
    """A guard against a hung in-process backend: `work` x $PARITY_BACKEND_TIMEOUT seconds for this call.

    Unset (the default): no deadline. Set: a call that has not returned when it runs out ends the run with
    one line naming the backend (BackendTimeout, made BackendMisbehaved by `call_backend`, exit 2). In the
    main thread on POSIX a SIGALRM timer (`signal.setitimer`) raises BackendTimeout in the call: it
    interrupts Python code and interruptible waits (sleep, a subprocess, a socket). A watchdog thread
    (`_Watchdog`) raises it again through GRACE_S seconds, then ends the process (`hard_stop`: one line, exit
    2): a call that catches every exception, cancels or ignores SIGALRM, or sits in native code is stopped
    too. In a worker thread (and on Windows) only the watchdog's hard stop applies. A call made inside
    another's deadline runs under the outer one.
    """
    from parity_harness._core.settings import seconds_from_env

    per_case = seconds_from_env(TIMEOUT_VARIABLE, math.inf)
    seconds = min(per_case * max(1, work), _MAX_TIMER_S)
    if getattr(_local, "armed", False) or not math.isfinite(per_case):
        yield
        return
    line = (f"backend {name!r} did not return from {what} within {seconds:g} s ({TIMEOUT_VARIABLE}={per_case:g} s "
            "per case): it hangs, or the deadline is too short for this machine")

    def _expired(signum: int, frame: Any) -> None:
        raise BackendTimeout(line)

    alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, _expired) if alarm else None
    _local.armed = True
    watchdog = _Watchdog(seconds, line, _expired if alarm else None)
    try:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        watchdog.stop()
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        _local.armed = False


class _StreamWatch:
    """sys.stdout and sys.stderr before a backend call, checked after it (`end`): a stream the call closed, or
    (when no other backend call or `quiet.silenced` overlapped it) an object left in its place, is put back
    usable and named. fd 1 and 2 stay open when a backend closes Python's streams (closefd=False)."""

    _lock = threading.Lock()
    _in_flight = 0
    _started = 0

    def __init__(self) -> None:
        cls = type(self)
        with cls._lock:
            self.solo = cls._in_flight == 0 and not _silencing()
            cls._in_flight += 1
            cls._started += 1
            self.mark = cls._started
            self.silences = _silence_entries()
            self.before = (sys.stdout, sys.stderr)

    def end(self) -> str:
        cls = type(self)
        with cls._lock:
            cls._in_flight -= 1
            # solo: no other call began, and no silencing began or is on (another thread's `silenced` swaps the
            # streams for a while: not this call's doing)
            solo = (self.solo and cls._started == self.mark and not _silencing()
                    and _silence_entries() == self.silences)
        problems = []
        for attr, fd, before in (("stdout", 1, self.before[0]), ("stderr", 2, self.before[1])):
            now = getattr(sys, attr)
            if _unusable(now):
                problems.append(f"closed sys.{attr}")
            elif solo and now is not before:
                problems.append(f"replaced sys.{attr}")
            else:
                continue
            setattr(sys, attr, _usable(before, fd))
        return " and ".join(problems)


def _silencing() -> bool:
    from parity_harness._backends import quiet

    return quiet._depth > 0


def _silence_entries() -> int:
    from parity_harness._backends import quiet

    return quiet._entries


def _unusable(stream: object) -> bool:
    """A stream that is closed, or no stream at all (None, an object without `write`); never raising."""
    try:
        return stream is None or not callable(getattr(stream, "write", None)) \
            or getattr(stream, "closed", False) is True
    except BaseException:
        return True


def _usable(before: object, fd: int) -> Any:
    """`before` if it still works; a SafeStream whose stream was closed, over a new one; else a new text stream
    on `fd` (the descriptor a closed sys.stdout/sys.stderr leaves open)."""
    from parity_harness._core.sanitize import SafeStream

    if not _unusable(before):
        return before
    if isinstance(before, SafeStream):
        inner: Any = vars(before).get("_stream")
        return SafeStream(inner if not _unusable(inner) else _fresh(fd, inner))
    return _fresh(fd, before)


def _fresh(fd: int, old: object) -> Any:
    encoding = "utf-8"
    with contextlib.suppress(BaseException):
        found = getattr(old, "encoding", None)
        encoding = found if isinstance(found, str) and found else encoding
    return open(fd, "w", buffering=1, encoding=encoding, errors="backslashreplace", closefd=False)


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
