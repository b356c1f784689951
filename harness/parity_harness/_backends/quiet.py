"""Third-party output kept off the user's terminal while backend code runs: one counted, process-wide context.

transformers, TransformerLens and torch's compiler warn, log and print things meant for model authors
(`bos_token_id must be None ...`, deprecation notices). A backend wraps the calls that do in `silenced()`:
while any thread is inside it, warnings are ignored, the root logger and `loggers` below ERROR are off, and
sys.stdout and sys.stderr go to a sink that drops what it is given. It is counted: the first thread in
saves the state and the last one out restores it, so two backends running side by side
(parity_harness/_run/lanes.py) cannot leave the process silenced or restore each other's state halfway,
as two nested `warnings.catch_warnings` or `contextlib.redirect_stdout` entered and left on two threads
could. parity's own lines are unaffected: progress goes to the stream bound when a run began, and the report
is printed after the run, when nothing is silenced.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


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
_saved: dict[str, Any] = {}
_levels: dict[str, int] = {}  # a logger's level before the first `silenced` that named it


@contextmanager
def silenced(loggers: tuple[str, ...] = ()) -> Iterator[None]:
    """Warnings, log records below ERROR (the root logger's and `loggers`') and prints dropped until the last
    thread inside leaves."""
    global _depth
    with _lock:
        if _depth == 0:
            keep = warnings.catch_warnings()
            keep.__enter__()
            warnings.simplefilter("ignore")
            _saved.update(warnings=keep, stdout=sys.stdout, stderr=sys.stderr, disable=logging.root.manager.disable)
            sys.stdout = sys.stderr = _Sink()  # type: ignore[assignment]
            logging.disable(logging.WARNING)
        for name in loggers:
            logger = logging.getLogger(name)
            if name not in _levels:
                _levels[name] = logger.level
            logger.setLevel(logging.ERROR)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, level in _levels.items():
                    logging.getLogger(name).setLevel(level)
                _levels.clear()
                logging.disable(_saved["disable"])
                sys.stdout, sys.stderr = _saved["stdout"], _saved["stderr"]
                _saved.pop("warnings").__exit__(None, None, None)
                _saved.clear()


def unsilenced_stderr() -> TextIO:
    """sys.stderr as it is outside `silenced`: for parity's own note from a backend that runs while another
    thread is silenced (lanes.py), which would otherwise go to the sink."""
    with _lock:
        return _saved["stderr"] if _depth else sys.stderr  # type: ignore[no-any-return]
