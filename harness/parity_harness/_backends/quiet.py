"""Third-party output kept off the user's terminal while backend code runs: one counted, process-wide context.

transformers, TransformerLens and torch's compiler warn, log and print things meant for model authors
(`bos_token_id must be None ...`, deprecation notices). A backend wraps the calls that do in `silenced()`:
while any thread is inside it, warnings are ignored, the root logger and `loggers` below ERROR are off, and
sys.stdout and sys.stderr go to a sink that drops what it is given. Native code (a C++ runtime's logging,
printf, anything written to the file descriptors) is kept off as well: file descriptors 1 and 2 point to a
temporary file while any thread is inside (os.dup/os.dup2, C's stdio flushed on the way in and out), and
are restored after; the last 8 KB of what native code wrote are kept (`captured_native`). It is counted:
the first thread in saves the state and the last one out restores it, so two backends running side by side
(parity_harness/_run/lanes.py) cannot leave the process silenced or restore each other's state halfway,
as two nested `warnings.catch_warnings` or `contextlib.redirect_stdout` entered and left on two threads
could. parity's own lines are unaffected: the report is printed after the run, when nothing is silenced; a
note printed meanwhile goes to `unsilenced_stderr()`, which writes to the real stderr (its saved descriptor);
and a hard stop (_backends/guard.py) puts the descriptors back (`put_back_descriptors`) before it prints.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO, cast

from parity_harness._backends.interrupts import interrupts_held


class _Sink:
    """A text stream that drops what it is given (and never grows)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


_lock = threading.Lock()
_depth = 0
_entries = 0  # how many times silencing began (0 -> 1 thread inside): a stream check spanning one cannot judge
_saved: dict[str, Any] = {}
_levels: dict[str, int] = {}  # a logger's level before the first `silenced` that named it
_fds: dict[int, int] = {}  # while silenced: fd 1 and 2 -> a duplicate of what they were (restored at the end)
_captured = ""  # the tail of what native code wrote to fd 1 and 2 the last time the process was silenced
CAPTURE_TAIL = 8192  # bytes of it kept


@contextmanager
def silenced(loggers: tuple[str, ...] = ()) -> Iterator[None]:
    """Warnings, log records below ERROR (the root logger's and `loggers`') and prints dropped until the last
    thread inside leaves."""
    global _depth, _entries
    entered = False  # set with the swap: an interrupt held until the swap is whole is raised inside the try
    try:
        with interrupts_held(), _lock:  # the streams swapped whole, never half (interrupts.py)
            if _depth == 0:
                _entries += 1
                keep = warnings.catch_warnings()
                keep.__enter__()
                warnings.simplefilter("ignore")
                _saved.update(warnings=keep, stdout=sys.stdout, stderr=sys.stderr,
                              disable=logging.root.manager.disable)
                sys.stdout = sys.stderr = _Sink()  # type: ignore[assignment]
                logging.disable(logging.WARNING)
                _redirect_fds()
            for name in loggers:
                logger = logging.getLogger(name)
                if name not in _levels:
                    _levels[name] = logger.level
                logger.setLevel(logging.ERROR)
            _depth += 1
            entered = True
        yield
    finally:
        with interrupts_held(), _lock:  # and put back whole
            if entered:
                _depth -= 1
                if _depth == 0:
                    _restore_fds()
                    for name, level in _levels.items():
                        logging.getLogger(name).setLevel(level)
                    _levels.clear()
                    logging.disable(_saved["disable"])
                    sys.stdout, sys.stderr = _saved["stdout"], _saved["stderr"]
                    _saved.pop("warnings").__exit__(None, None, None)
                    _saved.clear()


def unsilenced_stderr() -> TextIO:
    """A stream to the user's stderr whether or not the process is silenced: for parity's own note from a
    backend that runs while another thread is silenced (lanes.py), or from inside `silenced`, which would
    otherwise go to the sink (sys.stderr) or to the temporary file (fd 2)."""
    return cast(TextIO, _UNSILENCED)


def captured_native() -> str:
    """The last CAPTURE_TAIL bytes native code wrote to fd 1 and 2 the last time the process was silenced
    (decoded, undecodable bytes escaped): for a closer look when a backend fails; '' when nothing was written."""
    return _captured


class _Unsilenced:
    """`unsilenced_stderr()`: each write goes, at the time it is made, to the stream sys.stderr was before
    `silenced` (sys.stderr when nothing is silenced); when that stream writes to fd 1 or 2, which point to the
    temporary file while silenced, to the saved duplicate of that descriptor instead (sanitized as the CLI's
    streams are: parity_harness/_core/sanitize.py)."""

    def _target(self) -> tuple[Any, int | None]:
        """(the stream, or the saved descriptor to write to instead); called under _lock."""
        stream = _saved["stderr"] if _depth else sys.stderr
        if not _fds:
            return stream, None
        try:
            fileno = stream.fileno()
        except BaseException:  # a stream without a descriptor (a test's capture, a StringIO): it is the user's
            return stream, None
        return stream, _fds.get(fileno) if isinstance(fileno, int) else None

    def write(self, text: str) -> int:
        from parity_harness._core.sanitize import safe_line

        with _lock:
            stream, fd = self._target()
            if fd is not None:
                body = text.rstrip("\n")
                data = (safe_line(body) + text[len(body):]).encode("utf-8", "backslashreplace")
                with contextlib.suppress(OSError):
                    while data:
                        data = data[os.write(fd, data):]
                return len(text)
        return stream.write(text)  # type: ignore[no-any-return]

    def flush(self) -> None:
        with _lock:
            stream, fd = self._target()
        if fd is None:
            stream.flush()

    def isatty(self) -> bool:
        return False


_UNSILENCED = _Unsilenced()


def _flush_all() -> None:
    """Python's and C's buffered output written out now, before a descriptor changes what it points to."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):
            stream.flush()  # type: ignore[union-attr]
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(BaseException):
            libc.fflush(None)


_libc_handle: list[Any] = []


def _libc() -> Any:
    """The C library (for fflush(NULL)), or None where it cannot be loaded (Windows' CRTs are several)."""
    if not _libc_handle:
        handle = None
        if os.name == "posix":
            with contextlib.suppress(BaseException):
                import ctypes

                handle = ctypes.CDLL(None)
        _libc_handle.append(handle)
    return _libc_handle[0]


def _redirect_fds() -> None:
    """fd 1 and 2 to a temporary file (called under _lock by the first thread in); a descriptor that cannot be
    duplicated (closed, a sandbox) is left as it is."""
    try:
        sink = tempfile.TemporaryFile()  # noqa: SIM115  closed by _restore_fds, when the last thread leaves
    except OSError:
        return
    _flush_all()
    for fd in (1, 2):
        try:
            saved = os.dup(fd)
        except OSError:
            continue
        try:
            os.dup2(sink.fileno(), fd)
        except OSError:
            os.close(saved)
            continue
        _fds[fd] = saved
    if not _fds:
        sink.close()
        return
    _saved["sink"] = sink


def _restore_fds() -> None:
    """fd 1 and 2 as they were (called under _lock by the last thread out); what native code wrote is kept."""
    global _captured
    if "sink" not in _saved:
        return
    _flush_all()  # C's buffered printf into the temporary file, not onto the user's terminal afterwards
    for fd, saved in list(_fds.items()):
        with contextlib.suppress(OSError):
            os.dup2(saved, fd)
        with contextlib.suppress(OSError):
            os.close(saved)
    _fds.clear()
    sink = _saved.pop("sink")
    with contextlib.suppress(OSError):
        size = sink.seek(0, os.SEEK_END)
        sink.seek(max(0, size - CAPTURE_TAIL))
        _captured = sink.read().decode("utf-8", "backslashreplace")
    sink.close()


def put_back_descriptors() -> None:
    """fd 1 and 2 pointed back where they were, for a hard stop (_backends/guard.py, `hard_stop`) that ends the
    process while a backend is silenced: its one line must reach the real stderr. Takes no lock (the thread
    inside may hold it)."""
    for fd, saved in list(_fds.items()):
        with contextlib.suppress(OSError):
            os.dup2(saved, fd)
