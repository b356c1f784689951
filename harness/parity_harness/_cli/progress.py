"""Progress on stderr: one line rewritten in place on a terminal; elsewhere, a line only for work over a second.

Each progress message announces work that starts now ("parity: running numpy (fp32) ..."). On a terminal the
message replaces the previous one on a single line, cleared when the command ends. Elsewhere (a CI log, a pipe)
a message is printed only when no other message followed it within a second: the toy's 350 per-case messages
for work of milliseconds print nothing, a backend that takes seconds prints its line. Messages are sanitized
(`safe_line`) before they are written: they hold backend and case names from plugins and fixtures.
"""

from __future__ import annotations

import shutil
import threading
from typing import TextIO

from parity_harness._core.sanitize import safe_line

QUIET_FOR = 1.0  # seconds: work shorter than this prints no line outside a terminal
CLEAR_LINE = "\r\x1b[2K"  # carriage return, erase the line


class ProgressLine:
    """A progress callback (call it with a message); `close()` when the command's work is over."""

    def __init__(self, stream: TextIO, tty: bool | None = None, quiet_for: float = QUIET_FOR) -> None:
        self._stream = stream
        self._raw: TextIO = getattr(stream, "underlying", stream)  # SafeStream: its target (the text is made safe)
        self._tty = _isatty(stream) if tty is None else tty
        self._quiet_for = quiet_for
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._shown = False  # a terminal line is on screen
        self._closed = False

    def __call__(self, message: str) -> None:
        text = safe_line(str(message))
        with self._lock:
            if self._closed:
                return
            if self._tty:
                width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
                self._raw.write(CLEAR_LINE + text[:width])
                self._raw.flush()
                self._shown = True
                return
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self._quiet_for, self._print, args=(text,))
            self._timer.daemon = True
            self._timer.start()

    def _print(self, text: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._raw.write(text + "\n")
            self._raw.flush()

    def close(self) -> None:
        """Clear the terminal line, or drop the message of work that ended within the second."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._shown:
                self._raw.write(CLEAR_LINE)
                self._raw.flush()
                self._shown = False


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
